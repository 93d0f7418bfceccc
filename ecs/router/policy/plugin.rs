//! One plugin: a script compiled once, the hook it provides, its
//! parameters (a constant folded into the hook) and its `state`; and the
//! call of its hook, which skips rhai's function-call machinery.

use rhai::{AST, Dynamic, Engine, ImmutableString, Map, Scope};
use std::cell::RefCell;
use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::router::policy::checks::{
    check_given_params, check_length, check_params_use, check_properties, describe, error_line,
};
use crate::router::policy::direct::{Answer, Direct};
use crate::router::policy::memo::{self, Memo};
use crate::router::policy::sandbox::number;
use crate::router::policy::{PodView, ReqView};
use crate::scenario::ParamValue;

/// Which hook a plugin provides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Decide,
    Filter,
    Score,
    /// A scorer that scores all candidates in one call (to normalise over them).
    ScoreAll,
    Pick,
}

impl Hook {
    pub fn name(self) -> &'static str {
        match self {
            Hook::Decide => "decide",
            Hook::Filter => "filter",
            Hook::Score => "score",
            Hook::ScoreAll => "score_all",
            Hook::Pick => "pick",
        }
    }
    fn arity(self) -> usize {
        if self == Hook::Pick { 3 } else { 2 }
    }
    fn signature(self) -> &'static str {
        match self {
            Hook::Decide => {
                "fn decide(req, pod) -> bool, or fn decide(req, pod, prefill_pods) -> bool"
            }
            Hook::Filter => "fn filter(req, pods) -> array",
            Hook::Score | Hook::ScoreAll => {
                "fn score(req, pod) -> float, or fn score_all(req, pods) -> array"
            }
            Hook::Pick => "fn pick(req, pods, scores) -> int",
        }
    }
    fn kind(self) -> &'static str {
        match self {
            Hook::Decide => "decider",
            Hook::Filter => "filter",
            Hook::Score | Hook::ScoreAll => "scorer",
            Hook::Pick => "picker",
        }
    }
}

/// What `params` and `state` resolve to during a plugin's call (its tag).
#[derive(Clone)]
pub(crate) struct PluginEnv {
    pub(crate) params: Dynamic,
    pub(crate) state: Dynamic,
}

/// One configured plugin: a compiled script, its parameters and its state.
pub struct Plugin {
    pub path: String,
    pub hook: Hook,
    /// Its hook's parameters (a decider's 3 when it takes the prefill pods).
    pub arity: usize,
    /// Line of the hook's definition (for errors found after it returned).
    hook_line: Option<usize>,
    runtime: RefCell<Runtime>,
    /// The answers remembered when the hook is pure (see [`memo`]).
    pub(crate) memo: RefCell<Option<Memo>>,
    /// The hook translated for the host to evaluate, when it is in the
    /// subset [`direct`] takes (then neither rhai nor the memo runs, unless
    /// an evaluation gives up).
    pub(crate) direct: Option<Direct>,
    direct_on: std::cell::Cell<bool>,
    pub weight: f64,
}

/// What a hook is called on, for remembering its answer: the candidate
/// pods (positions in `pods`), and the scores (a picker's).
pub(crate) struct Inputs<'a> {
    pub pods: &'a [crate::router::policy::PodView],
    pub candidates: &'a [usize],
    pub scores: &'a [f64],
}

/// A plugin's rhai runtime, kept from call to call: its functions and tag
/// (`params`, `state`) installed once, and its function-resolution cache
/// warm. (`Engine::call_fn` would build both afresh on every call, and
/// resolving each getter and operator again was most of a hook's cost.)
/// Sound because nothing a resolution depends on changes during a run: the
/// engine is fixed after load, and a hot swap builds new plugins.
struct Runtime {
    global: rhai::GlobalRuntimeState,
    caches: rhai::Caches,
    /// The hook's arguments (its first variables, set per call) and then
    /// its local variables (dropped after each call).
    scope: Scope<'static>,
    /// The hook's body as top-level statements (see `Plugin::load`).
    body: AST,
    arg_names: Vec<ImmutableString>,
}

/// Converts a scenario parameter into a rhai value (integers stay INT).
fn to_dynamic(v: &ParamValue) -> Dynamic {
    match v {
        ParamValue::Int(i) => Dynamic::from_int(*i),
        ParamValue::Float(f) => Dynamic::from_float(*f),
        ParamValue::Bool(b) => Dynamic::from_bool(*b),
        ParamValue::Str(s) => Dynamic::from(s.clone()),
        ParamValue::List(l) => Dynamic::from_array(l.iter().map(to_dynamic).collect()),
        ParamValue::Map(m) => Dynamic::from_map(map_of(m)),
    }
}

pub(crate) fn map_of(params: &BTreeMap<String, ParamValue>) -> Map {
    params
        .iter()
        .map(|(k, v)| (k.as_str().into(), to_dynamic(v)))
        .collect()
}

/// `text` with every character outside the braces at `start` and `end`
/// (rhai positions: 1-based line and column, in characters), braces
/// included, turned into a space, newlines kept: the block's statements
/// compile on their own, at the same lines and columns as in the file.
fn only_between(text: &str, start: rhai::Position, end: rhai::Position) -> Option<String> {
    let (l0, c0, l1, c1) = (
        start.line()?,
        start.position()?,
        end.line()?,
        end.position()?,
    );
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let n = i + 1;
        for (k, ch) in line.chars().enumerate() {
            let col = k + 1;
            let inside = (n, col) > (l0, c0) && (n, col) < (l1, c1);
            out.push(if inside || ch == '\n' || ch == '\r' {
                ch
            } else {
                ' '
            });
        }
    }
    Some(out)
}

/// The 1-based line where `fn NAME(` is defined in `text`.
fn definition_line(text: &str, name: &str) -> Option<usize> {
    let needle = format!("fn {name}(");
    text.lines()
        .position(|l| l.trim_start().starts_with(&needle))
        .map(|i| i + 1)
}

impl Plugin {
    pub(crate) fn load(
        engine: &Engine,
        path: &str,
        kind: Hook,
        params: &BTreeMap<String, ParamValue>,
        weight: f64,
    ) -> Result<Plugin> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::new(format!("cannot read script {path}: {e}")))?;
        Plugin::from_text(engine, path, &text, kind, params, weight)
    }

    /// The plugin of script `text`, named `path` in its messages.
    pub(crate) fn from_text(
        engine: &Engine,
        path: &str,
        text: &str,
        kind: Hook,
        params: &BTreeMap<String, ParamValue>,
        weight: f64,
    ) -> Result<Plugin> {
        check_length(text, &format!("script {path}"))?;
        let compile = |scope: &Scope| {
            let mut ast = engine.compile_with_scope(scope, text).map_err(|e| {
                let line =
                    e.1.line()
                        .map(|l| format!(", line {l}"))
                        .unwrap_or_default();
                Error::new(format!("script {path}{line}: syntax error: {}", e.0))
            })?;
            ast.set_source(path);
            Ok::<_, Error>(ast)
        };
        // First compile: `params` and `state` declared as variables (for
        // strict-variable checking), to run the top level once (constants,
        // setup) and read its parameter defaults.
        let mut scope = Scope::new();
        scope.push("params", Map::new());
        scope.push("state", Map::new());
        let ast = compile(&scope)?;
        engine.run_ast_with_scope(&mut scope, &ast).map_err(|e| {
            Error::new(format!(
                "script {path}, top level, line {}: {}",
                error_line(&e).unwrap_or(0),
                describe(&e, engine)
            ))
        })?;
        // Parameter defaults: a top-level `const DEFAULTS = #{...}` map; the
        // scenario's parameters override them.
        let defaults = scope.get_value::<Map>("DEFAULTS").unwrap_or_default();
        // What the top level put in `state` is the plugin's initial state
        // (`state.n = 0;` there, and hooks read `state.n` directly).
        let initial_state = scope.get_value::<Map>("state").unwrap_or_default();
        let given = map_of(params);
        check_given_params(&ast, &defaults, &given, path)?;
        let mut merged = defaults;
        merged.extend(given);
        check_params_use(&ast, &merged, path)?;
        // Second compile, for the hooks: `params` is now a constant, so the
        // optimizer folds `params.x` into each hook (and a branch on it, like
        // `if params.source == "router"`, into the branch taken): reading a
        // parameter costs nothing per call. `state` stays per call (`on_var`).
        let mut scope = Scope::new();
        scope.push_constant("params", merged.clone());
        scope.push("state", Map::new());
        let mut ast = compile(&scope)?;
        ast.clear_statements();
        // A decider may take the candidate prefill pods as a third argument.
        let find = |h: Hook| {
            let arities: &[usize] = if h == Hook::Decide {
                &[3, 2]
            } else {
                &[h.arity()]
            };
            arities.iter().find_map(|&n| {
                ast.iter_fn_def()
                    .find(|f| f.name == h.name() && f.params.len() == n)
                    .map(|f| (h, f))
            })
        };
        let found = match kind {
            Hook::Score => find(Hook::Score).or_else(|| find(Hook::ScoreAll)),
            h => find(h),
        };
        let Some((hook, hook_fn)) = found else {
            return Err(Error::new(format!(
                "script {path}: it is used as a {} plugin but defines no `{}`",
                kind.kind(),
                kind.signature()
            )));
        };
        // The hook's body, compiled again on its own as top-level statements
        // with the hook's parameters as scope variables: a call then only
        // sets those variables and runs the statements, skipping rhai's
        // function-call machinery (which allocates per argument).
        let body_text = only_between(
            text,
            hook_fn.body.start_position(),
            hook_fn.body.end_position(),
        )
        .ok_or_else(|| {
            Error::new(format!(
                "script {path}: cannot locate the body of `{}`",
                hook.name()
            ))
        })?;
        let arg_names: Vec<ImmutableString> = hook_fn.params.iter().cloned().collect();
        for name in &arg_names {
            scope.push(name.clone(), ());
        }
        let mut body = engine.compile_with_scope(&scope, &body_text).map_err(|e| {
            let line =
                e.1.line()
                    .map(|l| format!(", line {l}"))
                    .unwrap_or_default();
            Error::new(format!(
                "script {path}{line}: hook `{}`: {}",
                hook.name(),
                e.0
            ))
        })?;
        body.set_source(path);
        let mut global = engine.new_global_runtime_state();
        global.lib.push(ast.shared_lib().clone());
        global.lib.push(body.shared_lib().clone()); // closures in the body
        global.source = ast.source().map(Into::into);
        global.tag = Dynamic::from(PluginEnv {
            params: Dynamic::from_map(merged).into_shared(),
            state: Dynamic::from_map(initial_state).into_shared(),
        });
        let mut caches = rhai::Caches::new();
        // A resolution layer that outlives each call, so what a call
        // resolves stays resolved.
        caches.push_fn_resolution_cache();
        let mut scope = Scope::new();
        for name in &arg_names {
            scope.push(name.clone(), ());
        }
        let runtime = Runtime {
            global,
            caches,
            scope,
            body,
            arg_names,
        };
        check_properties(&runtime.body, hook, &runtime.arg_names, path)?;
        let redefines = memo::redefines_pure_function(&ast);
        let memo = memo::pure_reads(&runtime.body, hook, &runtime.arg_names)
            .filter(|_| !redefines)
            .map(Memo::new);
        let direct = (!redefines)
            .then(|| {
                Direct::translate(
                    &runtime.body,
                    hook,
                    &runtime.arg_names,
                    engine.max_operations(),
                    engine.max_array_size(),
                )
            })
            .flatten();
        Ok(Plugin {
            path: path.to_string(),
            arity: runtime.arg_names.len(),
            hook,
            hook_line: definition_line(text, hook.name()),
            runtime: RefCell::new(runtime),
            memo: RefCell::new(memo),
            direct,
            direct_on: std::cell::Cell::new(true),
            weight,
        })
    }

    pub(crate) fn call(
        &self,
        engine: &Engine,
        args: impl rhai::FuncArgs,
        req: &ReqView,
    ) -> Result<Dynamic> {
        let mut values = rhai::FnArgsVec::new();
        args.parse(&mut values);
        let mut runtime = self.runtime.borrow_mut();
        let Runtime {
            global,
            caches,
            scope,
            body,
            arg_names,
        } = &mut *runtime;
        for (name, value) in arg_names.iter().zip(values) {
            *scope.get_mut(name).expect("hook argument in scope") = value;
        }
        // The operation limit is per call.
        global.num_operations = Default::default();
        // A panic inside rhai (an interpreter bug a strange script might
        // reach) becomes this script's error rather than a crash.
        #[allow(deprecated)] // rhai's internal entry point, kept under `internals`
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            engine.eval_statements_raw(global, caches, scope, body.statements())
        }));
        scope.rewind(arg_names.len());
        match out {
            Ok(result) => {
                result.map_err(|e| self.error(&describe(&e, engine), error_line(&e), req))
            }
            Err(_) => Err(self.error("the script interpreter failed (rhai panicked)", None, req)),
        }
    }

    /// The hook's answer on `inputs`: evaluated directly when the hook is
    /// in [`direct`]'s subset, else the remembered one when the hook is
    /// pure and answered the same inputs before, else computed from `args`
    /// (built only then).
    pub(crate) fn call_on<A: rhai::FuncArgs>(
        &self,
        engine: &Engine,
        inputs: Inputs,
        args: impl FnOnce() -> A,
        req: &ReqView,
    ) -> Result<Dynamic> {
        if matches!(self.hook, Hook::Decide | Hook::Score | Hook::Pick) {
            let (mut numbers, mut kept) = (Vec::new(), Vec::new());
            let direct = self.answer_directly(
                engine,
                &inputs,
                req,
                &mut numbers,
                &mut kept,
                None::<fn() -> A>,
            );
            if let Some(answer) = direct {
                if cfg!(debug_assertions) {
                    self.check_direct(engine, &answer, &inputs, &numbers, &kept, args(), req);
                }
                return Ok(match answer {
                    Answer::Bool(b) => Dynamic::from_bool(b),
                    Answer::Number(x) => Dynamic::from_float(x),
                    Answer::Int(i) => Dynamic::from_int(i),
                    Answer::Numbers | Answer::Kept => unreachable!("a scalar hook"),
                });
            }
        }
        let mut slot = self.memo.borrow_mut();
        let Some(memo) = slot.as_mut() else {
            return self.call(engine, args(), req);
        };
        if !memo.active() {
            *slot = None; // its inputs seldom repeat: forget the answers
            return self.call(engine, args(), req);
        }
        let pods = inputs.candidates.iter().map(|&i| &inputs.pods[i]);
        if let Some(answer) = memo.look_up(req, pods, inputs.scores) {
            return Ok(answer);
        }
        let answer = self.call(engine, args(), req)?;
        memo.remember(&answer);
        Ok(answer)
    }

    /// The hook's answer evaluated by the host ([`direct`]), or None where
    /// rhai must answer: a `score_all`'s numbers go to `numbers`, a
    /// `filter`'s kept positions to `kept`. Debug builds check it against
    /// rhai's, computed from `args` when given.
    pub(crate) fn answer_directly<A: rhai::FuncArgs>(
        &self,
        engine: &Engine,
        inputs: &Inputs,
        req: &ReqView,
        numbers: &mut Vec<f64>,
        kept: &mut Vec<usize>,
        args: Option<impl FnOnce() -> A>,
    ) -> Option<Answer> {
        let direct = self.direct.as_ref().filter(|_| self.direct_on.get())?;
        // A `score_all` walks the pods, twice in the catalogue's: when it
        // is pure and its inputs repeat, its remembered answer costs less.
        let remembered =
            self.hook == Hook::ScoreAll && self.remembered_numbers(inputs, req, numbers);
        let answer = if remembered {
            Answer::Numbers
        } else {
            let answer = direct.answer(self.hook, req, inputs, numbers, kept)?;
            if self.hook == Hook::ScoreAll {
                self.remember_numbers(numbers);
            }
            answer
        };
        if cfg!(debug_assertions)
            && let Some(args) = args
        {
            self.check_direct(engine, &answer, inputs, numbers, kept, args(), req);
        }
        Some(answer)
    }

    /// A pure `score_all`'s remembered numbers for these inputs, into
    /// `numbers`; false when there are none (the memo then keeps the key
    /// for [`Self::remember_numbers`]).
    fn remembered_numbers(&self, inputs: &Inputs, req: &ReqView, numbers: &mut Vec<f64>) -> bool {
        let mut slot = self.memo.borrow_mut();
        let Some(memo) = slot.as_mut() else {
            return false;
        };
        if !memo.active() {
            *slot = None; // its inputs seldom repeat: forget the answers
            return false;
        }
        let pods = inputs.candidates.iter().map(|&i| &inputs.pods[i]);
        let Some(answer) = memo.find(req, pods, inputs.scores) else {
            return false;
        };
        // (An answer of rhai's that is not all numbers failed its call:
        // the host evaluates this one.)
        let Ok(items) = answer.as_array_ref() else {
            return false;
        };
        numbers.clear();
        for v in items.iter() {
            let Some(x) = crate::router::policy::sandbox::number(v) else {
                return false;
            };
            numbers.push(x);
        }
        true
    }

    /// Remembers the host's `score_all` numbers for the inputs of the
    /// look-up just made (nothing when the hook is not remembered).
    fn remember_numbers(&self, numbers: &[f64]) {
        if let Some(memo) = self.memo.borrow_mut().as_mut() {
            let answer: rhai::Array = numbers.iter().map(|&x| Dynamic::from_float(x)).collect();
            memo.remember(&Dynamic::from_array(answer));
        }
    }

    /// Panics unless rhai answers what the host did (debug builds).
    #[allow(clippy::too_many_arguments)]
    fn check_direct(
        &self,
        engine: &Engine,
        answer: &Answer,
        inputs: &Inputs,
        numbers: &[f64],
        kept: &[usize],
        args: impl rhai::FuncArgs,
        req: &ReqView,
    ) {
        match self.rhai_agrees(engine, answer, inputs, numbers, kept, args, req) {
            Ok(true) => {}
            Ok(false) => panic!(
                "{}: the host's direct answer differs from rhai's",
                self.path
            ),
            Err(e) => panic!("{}: rhai failed where the host answered: {e}", self.path),
        }
    }

    /// Whether rhai, run on `args`, answers what the host did.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rhai_agrees(
        &self,
        engine: &Engine,
        answer: &Answer,
        inputs: &Inputs,
        numbers: &[f64],
        kept: &[usize],
        args: impl rhai::FuncArgs,
        req: &ReqView,
    ) -> Result<bool> {
        let out = self.call(engine, args, req)?;
        let same = |x: f64, y: Option<f64>| y.is_some_and(|y| x.to_bits() == y.to_bits());
        Ok(match answer {
            Answer::Bool(b) => out.as_bool() == Ok(*b),
            Answer::Int(i) => out.as_int() == Ok(*i),
            Answer::Number(x) => same(*x, number(&out)),
            Answer::Numbers => out.try_cast::<rhai::Array>().is_some_and(|a| {
                a.len() == numbers.len() && a.iter().zip(numbers).all(|(v, &x)| same(x, number(v)))
            }),
            Answer::Kept => out.try_cast::<rhai::Array>().is_some_and(|a| {
                let mut got: Vec<usize> = a
                    .iter()
                    .filter_map(|v| v.read_lock::<PodView>().map(|p| p.index))
                    .filter_map(|index| {
                        inputs
                            .candidates
                            .iter()
                            .copied()
                            .find(|&i| inputs.pods[i].index == index)
                    })
                    .collect();
                got.sort_unstable();
                got == kept
            }),
        })
    }

    /// Whether the hook's answers are remembered: it is pure, and its
    /// inputs have not turned out to seldom repeat (see [`memo::TRIAL`]).
    pub fn remembers(&self) -> bool {
        self.memo.borrow().is_some()
    }

    /// Whether the host evaluates the hook itself ([`direct`]).
    pub fn evaluates_directly(&self) -> bool {
        self.direct.is_some() && self.direct_on.get()
    }

    /// From now on the hook runs in rhai on every call (to measure the
    /// scripts, or to check that the shortcuts change nothing).
    pub fn forget_answers(&self) {
        *self.memo.borrow_mut() = None;
        self.direct_on.set(false);
    }

    /// An error naming the script, the hook, the line and the request. For
    /// a wrong return value the line is the hook's definition.
    pub fn error(&self, what: &str, line: Option<usize>, req: &ReqView) -> Error {
        let line = line
            .or(self.hook_line)
            .map(|l| format!(", line {l}"))
            .unwrap_or_default();
        Error::new(format!(
            "script {}, hook `{}`{line}: {what} (while routing request {} of session {}, turn {})",
            self.path,
            self.hook.name(),
            req.id,
            req.session,
            req.turn
        ))
    }
}
