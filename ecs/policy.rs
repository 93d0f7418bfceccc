//! Routing policies as rhai scripts: one sandboxed rhai engine; each plugin
//! (decider, filter, scorer, picker) a compiled script with its own
//! parameters and state. Hooks (docs/policies.md):
//!
//! | plugin  | hook                                   | returns                           |
//! |---------|----------------------------------------|-----------------------------------|
//! | decider | `fn decide(req, pod)`                  | bool: prefill remotely?           |
//! | filter  | `fn filter(req, pods)`                 | array: the pods kept              |
//! | scorer  | `fn score(req, pod)`                   | number, documented in [0, 1]      |
//! |         | or `fn score_all(req, pods)`           | array: one number per pod         |
//! | picker  | `fn pick(req, pods, scores)`           | int: an index into `pods`         |
//!
//! Scripts are compiled once; their top level runs once (at load) and hooks
//! are called without re-running it. Every hook sees `params` (the plugin's
//! parameters from the scenario, a constant folded into the hooks at load)
//! and `state` (a map the plugin may keep between calls, e.g. a round-robin
//! counter, resolved per call from the plugin's runtime), so one file can
//! serve several plugins. Modules in `lib/` are available to every script
//! by file name (`lib/pd.rhai` → `pd::f(x)`).

use rhai::{AST, Array, Dynamic, Engine, EvalAltResult, ImmutableString, Map, Module, Scope};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;

use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::error::{Error, Result};
use crate::scenario::{self, ParamValue};

/// What a script sees of the request being routed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReqView {
    pub id: i64,
    pub session: i64,
    pub turn: i64,
    pub prompt_tokens: i64,
    pub new_tokens: i64,
    pub block_size: i64,
}

/// What a script sees of one candidate instance.
#[derive(Clone, Debug, Default)]
pub struct PodView {
    pub role: ImmutableString,
    pub index: i64,
    /// Requests the instance holds or queues: running + parked + ready + waiting.
    pub active: i64,
    pub running: i64,
    /// Waiting for admission (no KV yet), including preempted ones.
    pub queued: i64,
    /// Remote prefills holding KV while their read is in flight.
    pub parked: i64,
    /// Prompt tokens its admitted requests have not computed yet.
    pub prompt_backlog: i64,
    pub kv_capacity: i64,
    pub kv_held: i64,
    pub kv_free_cached: i64,
    /// Longest cached prefix of this request's prompt there, whole blocks,
    /// never the last token: `min(cachedin, reusable(prompt))`.
    pub cached_tokens: i64,
    pub max_num_seqs: i64,
    pub nic_flows: i64,
    /// The router's own bookkeeping (llm-d): in-flight requests and tokens it
    /// sent there, and its approximate prefix index's estimate of the hit.
    pub router_requests: i64,
    pub router_tokens: i64,
    pub router_cached_tokens: i64,
}

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
            Hook::Decide => "fn decide(req, pod) -> bool",
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
struct PluginEnv {
    params: Dynamic,
    state: Dynamic,
}

/// One configured plugin: a compiled script, its parameters and its state.
pub struct Plugin {
    pub path: String,
    pub hook: Hook,
    /// Line of the hook's definition (for errors found after it returned).
    hook_line: Option<usize>,
    runtime: RefCell<Runtime>,
    pub weight: f64,
    /// Whether the script reads or writes `state` (the only way a value it
    /// is given can outlive its call).
    uses_state: bool,
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

/// The scheduling profile of one role: filters → weighted scorers → picker.
pub struct Profile {
    pub filters: Vec<Plugin>,
    pub scorers: Vec<Plugin>,
    pub picker: Plugin,
}

/// The router's policies, compiled.
pub struct Policies {
    engine: Engine,
    pub decider: Plugin,
    pub decode: Profile,
    pub prefill: Profile,
    /// Scratch, reused across requests.
    scores: Vec<f64>,
    candidates: Vec<usize>,
    kept: Vec<usize>,
    pod_args: Vec<Dynamic>,
    req_arg: Option<(ReqView, Dynamic)>,
    /// Whether a value given to a script can outlive its call (only through
    /// a plugin's `state`). When none can, the request's and the pods'
    /// script values are refilled in place for the next decision rather
    /// than allocated anew.
    values_escape: bool,
}

/// Operations a single hook call may take before it is stopped.
pub const MAX_OPERATIONS: u64 = 1_000_000;

fn new_engine(seed: u64, lib: Option<&Path>) -> Result<Engine> {
    let mut engine = Engine::new_raw();
    // Only pure computation: rhai's standard packages have no file, network
    // or time access, and no module resolver is installed (`import` fails).
    engine.register_global_module(rhai::packages::Package::as_shared_module(
        &rhai::packages::StandardPackage::new(),
    ));
    engine.set_strict_variables(true);
    engine.set_fail_on_invalid_map_property(true);
    engine.set_max_operations(MAX_OPERATIONS);
    engine.set_max_call_levels(64);
    engine.set_max_expr_depths(64, 64);
    // No separate size limits for strings, arrays and maps: the operation
    // limit bounds what a call can build (and rhai's size checks do not
    // accept the shared values that pods and `state` are passed as).
    engine.set_optimization_level(rhai::OptimizationLevel::Simple);
    engine.on_print(|s| tracing::info!(target: "pdsim::script", "{s}"));
    engine.on_debug(
        |s, src, pos| tracing::debug!(target: "pdsim::script", "{}:{pos}: {s}", src.unwrap_or("")),
    );
    // `eval` would turn off constant folding, which `params` relies on
    // (see `Plugin::load`); a policy has no use for it.
    engine.disable_symbol("eval");
    // `state` is the calling plugin's own map, carried by the call's tag,
    // and so is `params` where it was not folded into the hook at load (as
    // the root of `params.x.f()`) — unless a hook's own parameter has that
    // name. Called for every variable read, so locals (index > 0) leave at
    // once.
    #[allow(deprecated)]
    engine.on_var(|name, index, ctx| {
        if index > 0 || !matches!(name, "params" | "state") || ctx.scope().contains(name) {
            return Ok(None);
        }
        let env = ctx.tag().read_lock::<PluginEnv>();
        Ok(env.map(|e| {
            if name == "params" {
                e.params.clone()
            } else {
                e.state.clone()
            }
        }))
    });

    engine
        .register_type_with_name::<ReqView>("Request")
        .register_get("id", |r: &mut ReqView| r.id)
        .register_get("session", |r: &mut ReqView| r.session)
        .register_get("turn", |r: &mut ReqView| r.turn)
        .register_get("prompt_tokens", |r: &mut ReqView| r.prompt_tokens)
        .register_get("new_tokens", |r: &mut ReqView| r.new_tokens)
        .register_get("block_size", |r: &mut ReqView| r.block_size);

    engine
        .register_type_with_name::<PodView>("Pod")
        .register_get("role", |p: &mut PodView| p.role.clone())
        .register_get("index", |p: &mut PodView| p.index)
        .register_get("active", |p: &mut PodView| p.active)
        .register_get("running", |p: &mut PodView| p.running)
        .register_get("queued", |p: &mut PodView| p.queued)
        .register_get("parked", |p: &mut PodView| p.parked)
        .register_get("prompt_backlog", |p: &mut PodView| p.prompt_backlog)
        .register_get("kv_capacity", |p: &mut PodView| p.kv_capacity)
        .register_get("kv_held", |p: &mut PodView| p.kv_held)
        .register_get("kv_free_cached", |p: &mut PodView| p.kv_free_cached)
        .register_get("cached_tokens", |p: &mut PodView| p.cached_tokens)
        .register_get("max_num_seqs", |p: &mut PodView| p.max_num_seqs)
        .register_get("nic_flows", |p: &mut PodView| p.nic_flows)
        .register_get("router_requests", |p: &mut PodView| p.router_requests)
        .register_get("router_tokens", |p: &mut PodView| p.router_tokens)
        .register_get("router_cached_tokens", |p: &mut PodView| {
            p.router_cached_tokens
        });

    // Seeded randomness for policies (random tie-breaks, random pickers):
    // one stream per run, drawn in routing order, so runs are reproducible.
    let rng = Rc::new(RefCell::new(Xoshiro256PlusPlus::seed_from_u64(
        seed ^ 0x5EED_0F20_07E5,
    )));
    let r = rng.clone();
    engine.register_fn("random", move || -> f64 { r.borrow_mut().random::<f64>() });
    let r = rng.clone();
    engine.register_fn("random_int", move |n: i64| -> i64 {
        if n <= 0 {
            0
        } else {
            r.borrow_mut().random_range(0..n)
        }
    });
    // argmax(scores, ties): index of the largest score; ties to the first
    // ("first") or at random among the tied ("random"). Native for speed:
    // every max-score pick calls it.
    engine.register_fn(
        "argmax",
        move |scores: &mut Array,
              ties: ImmutableString|
              -> std::result::Result<i64, Box<EvalAltResult>> {
            // Passes over the scores rather than a copy of them: no allocation.
            let mut best = f64::NEG_INFINITY;
            for v in scores.iter() {
                let x = number(v).filter(|x| !x.is_nan()).ok_or_else(|| {
                    format!(
                        "argmax: scores must be numbers, found {} {v}",
                        v.type_name()
                    )
                })?;
                best = best.max(x);
            }
            if scores.is_empty() {
                return Err("argmax: no scores".into());
            }
            let is_best = |v: &Dynamic| number(v) == Some(best);
            let nth = match ties.as_str() {
                "first" => 0,
                "random" => {
                    let tied = scores.iter().filter(|v| is_best(v)).count();
                    rng.borrow_mut().random_range(0..tied)
                }
                other => {
                    return Err(format!(
                        "argmax: ties must be \"first\" or \"random\", not {other:?}"
                    )
                    .into());
                }
            };
            Ok(scores
                .iter()
                .enumerate()
                .filter(|(_, v)| is_best(v))
                .nth(nth)
                .map(|(i, _)| i as i64)
                .unwrap_or(0))
        },
    );

    // Shared modules: every lib/NAME.rhai becomes the namespace NAME::.
    if let Some(dir) = lib {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| {
                Error::new(format!(
                    "cannot read the script library {}: {e}",
                    dir.display()
                ))
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "rhai"))
            .collect();
        files.sort();
        for path in files {
            let name = path
                .file_stem()
                .unwrap()
                .to_string_lossy()
                .replace('-', "_");
            let text = std::fs::read_to_string(&path).map_err(|e| {
                Error::new(format!("cannot read script module {}: {e}", path.display()))
            })?;
            let mut ast = engine.compile(&text).map_err(|e| {
                Error::new(format!(
                    "script module {}, line {}: syntax error: {}",
                    path.display(),
                    e.1.line().unwrap_or(0),
                    e.0
                ))
            })?;
            ast.set_source(path.to_string_lossy().as_ref());
            let module = Module::eval_ast_as_new(Scope::new(), &ast, &engine).map_err(|e| {
                Error::new(format!(
                    "script module {}, line {}: {}",
                    path.display(),
                    error_line(&e).unwrap_or(0),
                    describe(&e)
                ))
            })?;
            engine.register_static_module(name.as_str(), module.into());
        }
    }
    Ok(engine)
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

fn map_of(params: &BTreeMap<String, ParamValue>) -> Map {
    params
        .iter()
        .map(|(k, v)| (k.as_str().into(), to_dynamic(v)))
        .collect()
}

/// The line an error happened at, looking inside nested function calls.
fn error_line(err: &EvalAltResult) -> Option<usize> {
    match err {
        EvalAltResult::ErrorInFunctionCall(_, _, inner, pos) => error_line(inner).or(pos.line()),
        other => other.position().line(),
    }
}

fn describe(err: &EvalAltResult) -> String {
    match err {
        EvalAltResult::ErrorInFunctionCall(_, _, inner, _) => describe(inner),
        EvalAltResult::ErrorTooManyOperations(_) => {
            format!(
                "the script ran more than {MAX_OPERATIONS} operations (an endless loop?) and was stopped"
            )
        }
        other => {
            // Drop rhai's own "(line x, position y)" suffix: we print the line.
            let s = other.to_string();
            match s.rfind(" (line ") {
                Some(i) => s[..i].to_string(),
                None => s,
            }
        }
    }
}

/// Whether any expression of `ast` (hooks, helpers, top level) names the
/// variable `name`.
fn mentions_variable(ast: &AST, name: &str) -> bool {
    use rhai::{ASTNode, Expr};
    let mut found = false;
    ast.walk(&mut |nodes: &[ASTNode]| {
        if let Some(ASTNode::Expr(Expr::Variable(v, ..))) = nodes.last()
            && v.1 == name
        {
            found = true;
            return false;
        }
        true
    });
    found
}

/// Refuses a script that reads a parameter which neither its `DEFAULTS` nor
/// the scenario gives, or that assigns to `params`. Hooks read parameters
/// as folded constants, so a misspelt name is caught here, at load, rather
/// than read as `()`. (`params?.x` is an explicitly optional read and is not
/// checked.)
fn check_params_use(ast: &AST, params: &Map, path: &str) -> Result<()> {
    use rhai::{ASTFlags, ASTNode, Expr, Stmt};
    fn rooted_at_params(e: &Expr) -> bool {
        match e {
            Expr::Variable(v, ..) => v.1 == "params",
            Expr::Dot(x, ..) | Expr::Index(x, ..) => rooted_at_params(&x.lhs),
            _ => false,
        }
    }
    let mut assigned = None;
    let key = |e: &Expr| match e {
        Expr::Property(p, _) => Some(p.2.clone()),
        Expr::StringConstant(s, _) => Some(s.clone()),
        Expr::Dot(x, ..) | Expr::Index(x, ..) => match &x.lhs {
            Expr::Property(p, _) => Some(p.2.clone()),
            Expr::StringConstant(s, _) => Some(s.clone()),
            _ => None,
        },
        _ => None,
    };
    let mut missing = None;
    ast.walk(&mut |nodes: &[ASTNode]| {
        if let Some(ASTNode::Stmt(Stmt::Assignment(x))) = nodes.last()
            && rooted_at_params(&x.1.lhs)
        {
            assigned = Some(x.1.lhs.position().line());
            return false;
        }
        if let Some(ASTNode::Expr(Expr::Dot(x, flags, pos) | Expr::Index(x, flags, pos))) =
            nodes.last()
            && !flags.intersects(ASTFlags::NEGATED)
            && matches!(&x.lhs, Expr::Variable(v, ..) if v.1 == "params")
            && let Some(name) = key(&x.rhs)
            && !params.contains_key(name.as_str())
        {
            missing = Some((name, pos.line()));
            return false;
        }
        true
    });
    let at = |line: Option<usize>| line.map(|l| format!(", line {l}")).unwrap_or_default();
    if let Some(line) = assigned {
        return Err(Error::new(format!(
            "script {path}{}: it assigns to `params`, which is read-only \
             (parameters come from the scenario; keep what changes in `state`)",
            at(line)
        )));
    }
    match missing {
        None => Ok(()),
        Some((name, line)) => {
            let known: Vec<&str> = params.keys().map(|k| k.as_str()).collect();
            Err(Error::new(format!(
                "script {path}{}: it reads `params.{name}`, which the scenario does not set \
                 and the script's `const DEFAULTS` does not declare (known: {})",
                at(line),
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )))
        }
    }
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
    fn load(
        engine: &Engine,
        path: &str,
        kind: Hook,
        params: &BTreeMap<String, ParamValue>,
        weight: f64,
    ) -> Result<Plugin> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::new(format!("cannot read script {path}: {e}")))?;
        let compile = |scope: &Scope| {
            let mut ast = engine.compile_with_scope(scope, &text).map_err(|e| {
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
                describe(&e)
            ))
        })?;
        // Parameter defaults: a top-level `const DEFAULTS = #{...}` map; the
        // scenario's parameters override them.
        let mut merged = scope.get_value::<Map>("DEFAULTS").unwrap_or_default();
        merged.extend(map_of(params));
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
        let find = |h: Hook| {
            ast.iter_fn_def()
                .find(|f| f.name == h.name() && f.params.len() == h.arity())
                .map(|f| (h, f))
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
            &text,
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
            state: Dynamic::from_map(Map::new()).into_shared(),
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
        Ok(Plugin {
            path: path.to_string(),
            hook,
            hook_line: definition_line(&text, hook.name()),
            runtime: RefCell::new(runtime),
            weight,
            uses_state: mentions_variable(&ast, "state"),
        })
    }

    fn call(&self, engine: &Engine, args: impl rhai::FuncArgs, req: &ReqView) -> Result<Dynamic> {
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
            Ok(result) => result.map_err(|e| self.error(&describe(&e), error_line(&e), req)),
            Err(_) => Err(self.error("the script interpreter failed (rhai panicked)", None, req)),
        }
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

/// Puts `value` into the shared script value `cell` (a new cell if it is
/// borrowed, which nothing does between calls).
fn refill<T: rhai::Variant + Clone>(cell: &mut Dynamic, value: &T) {
    if let Some(mut inner) = cell.write_lock::<T>() {
        *inner = value.clone();
        return;
    }
    *cell = Dynamic::from(value.clone()).into_shared();
}

fn number(v: &Dynamic) -> Option<f64> {
    v.as_float()
        .ok()
        .or_else(|| v.as_int().ok().map(|i| i as f64))
}

impl Profile {
    fn load(engine: &Engine, p: &scenario::Profile) -> Result<Profile> {
        Ok(Profile {
            filters: p
                .filters
                .iter()
                .map(|f| Plugin::load(engine, &f.script, Hook::Filter, &f.params, 1.0))
                .collect::<Result<_>>()?,
            scorers: p
                .scorers
                .iter()
                .map(|s| Plugin::load(engine, &s.script, Hook::Score, &s.params, s.weight))
                .collect::<Result<_>>()?,
            picker: Plugin::load(engine, &p.picker.script, Hook::Pick, &p.picker.params, 1.0)?,
        })
    }
}

impl Policies {
    /// Compiles every script the router section names (plugin references
    /// already expanded, see `scenario::expand_plugins`), with the modules of
    /// `lib` available to them.
    pub fn load(router: &scenario::Router, seed: u64, lib: Option<&Path>) -> Result<Policies> {
        let engine = new_engine(seed, lib)?;
        let mut policies = Policies {
            decider: Plugin::load(
                &engine,
                &router.decider.script,
                Hook::Decide,
                &router.decider.params,
                1.0,
            )?,
            decode: Profile::load(&engine, &router.decode)?,
            prefill: Profile::load(&engine, &router.prefill)?,
            engine,
            scores: Vec::new(),
            candidates: Vec::new(),
            kept: Vec::new(),
            pod_args: Vec::new(),
            req_arg: None,
            values_escape: true,
        };
        policies.values_escape = policies.any_keeps_state();
        Ok(policies)
    }

    fn any_keeps_state(&self) -> bool {
        let profile = |p: &Profile| {
            p.filters.iter().chain(&p.scorers).any(|f| f.uses_state) || p.picker.uses_state
        };
        self.decider.uses_state || profile(&self.decode) || profile(&self.prefill)
    }

    /// Hot swap: recompiles the router's plugins from a new configuration,
    /// keeping the engine (and its seeded random stream). Plugins restart
    /// with empty state.
    pub fn reload(&mut self, router: &scenario::Router) -> Result<()> {
        self.decider = Plugin::load(
            &self.engine,
            &router.decider.script,
            Hook::Decide,
            &router.decider.params,
            1.0,
        )?;
        self.decode = Profile::load(&self.engine, &router.decode)?;
        self.prefill = Profile::load(&self.engine, &router.prefill)?;
        self.values_escape = self.any_keeps_state();
        self.pod_args.clear();
        self.req_arg = None;
        Ok(())
    }

    /// The request as a script value, made once per decision: the decode
    /// profile, the decider and the prefill profile share it.
    fn req_arg(&mut self, req: &ReqView) -> Dynamic {
        match &mut self.req_arg {
            Some((view, arg)) if view == req => arg.clone(),
            Some((view, arg)) if !self.values_escape => {
                refill(arg, req);
                *view = req.clone();
                arg.clone()
            }
            _ => {
                let arg = Dynamic::from(req.clone()).into_shared();
                self.req_arg = Some((req.clone(), arg.clone()));
                arg
            }
        }
    }

    /// The decider's verdict: prefill remotely?
    pub fn decide(&mut self, req: &ReqView, pod: &PodView) -> Result<bool> {
        let req_arg = self.req_arg(req);
        let d = &self.decider;
        let out = d.call(&self.engine, (req_arg, pod.clone()), req)?;
        out.as_bool().map_err(|t| {
            d.error(
                &format!("`decide` must return a bool, it returned {t}"),
                None,
                req,
            )
        })
    }

    /// Runs a profile over `pods`; returns the position in `pods` of the pick.
    pub fn choose(&mut self, role: Role, req: &ReqView, pods: &[PodView]) -> Result<usize> {
        let req_arg = self.req_arg(req);
        let profile = match role {
            Role::Decode => &self.decode,
            Role::Prefill => &self.prefill,
        };
        // Each pod is one shared script value that the calls share, refilled
        // in place when no value can escape (see `values_escape`).
        if self.values_escape {
            self.pod_args.clear();
        }
        self.pod_args.truncate(pods.len());
        for (i, p) in pods.iter().enumerate() {
            match self.pod_args.get_mut(i) {
                Some(arg) => refill(arg, p),
                None => self.pod_args.push(Dynamic::from(p.clone()).into_shared()),
            }
        }
        let candidates = &mut self.candidates;
        candidates.clear();
        candidates.extend(0..pods.len());
        let array_of = |c: &[usize], args: &[Dynamic]| -> Array {
            c.iter().map(|&i| args[i].clone()).collect()
        };

        // Filters: each keeps a subset; keeping nobody is an error (a request
        // must go somewhere: llm-d's filters fall back to all themselves).
        for f in &profile.filters {
            let out = f.call(
                &self.engine,
                (req_arg.clone(), array_of(candidates, &self.pod_args)),
                req,
            )?;
            let kept = out
                .try_cast::<Array>()
                .ok_or_else(|| f.error("`filter` must return an array of pods", None, req))?;
            let next = &mut self.kept;
            next.clear();
            for k in kept {
                let index = k.read_lock::<PodView>().map(|p| p.index).ok_or_else(|| {
                    f.error(
                        "`filter` must return pods (items of its `pods` argument)",
                        None,
                        req,
                    )
                })?;
                let pos = candidates
                    .iter()
                    .copied()
                    .find(|&i| pods[i].index == index)
                    .ok_or_else(|| {
                        f.error(
                            &format!("`filter` returned pod {index}, which was not a candidate"),
                            None,
                            req,
                        )
                    })?;
                if !next.contains(&pos) {
                    next.push(pos);
                }
            }
            if next.is_empty() {
                return Err(f.error(
                    "`filter` kept no pod; a filter must keep at least one",
                    None,
                    req,
                ));
            }
            next.sort_unstable();
            std::mem::swap(candidates, next);
        }

        // Weighted sum of the scorers' scores.
        self.scores.clear();
        self.scores.resize(candidates.len(), 0.0);
        for s in &profile.scorers {
            let add = |k: usize, out: &Dynamic, scores: &mut Vec<f64>| -> Result<()> {
                let v = number(out).ok_or_else(|| {
                    s.error(
                        &format!(
                            "`{}` must return numbers, it returned {}",
                            s.hook.name(),
                            out.type_name()
                        ),
                        None,
                        req,
                    )
                })?;
                if !v.is_finite() {
                    let pod = pods[candidates[k]].index;
                    return Err(s.error(
                        &format!(
                            "`{}` returned {v} for pod {pod}; scores must be finite",
                            s.hook.name()
                        ),
                        None,
                        req,
                    ));
                }
                scores[k] += s.weight * v;
                Ok(())
            };
            if s.hook == Hook::ScoreAll {
                let out = s.call(
                    &self.engine,
                    (req_arg.clone(), array_of(candidates, &self.pod_args)),
                    req,
                )?;
                let arr = out.try_cast::<Array>().ok_or_else(|| {
                    s.error(
                        "`score_all` must return an array with one number per pod",
                        None,
                        req,
                    )
                })?;
                if arr.len() != candidates.len() {
                    return Err(s.error(
                        &format!(
                            "`score_all` returned {} scores for {} pods",
                            arr.len(),
                            candidates.len()
                        ),
                        None,
                        req,
                    ));
                }
                for (k, v) in arr.iter().enumerate() {
                    add(k, v, &mut self.scores)?;
                }
            } else {
                for (k, &pod) in candidates.iter().enumerate() {
                    let args = (req_arg.clone(), self.pod_args[pod].clone());
                    let out = s.call(&self.engine, args, req)?;
                    add(k, &out, &mut self.scores)?;
                }
            }
        }

        let scores: Array = self
            .scores
            .iter()
            .map(|&v| Dynamic::from_float(v))
            .collect();
        let p = &profile.picker;
        let out = p.call(
            &self.engine,
            (req_arg, array_of(candidates, &self.pod_args), scores),
            req,
        )?;
        let idx = out.as_int().map_err(|t| {
            p.error(
                &format!("`pick` must return an int index, it returned {t}"),
                None,
                req,
            )
        })?;
        if idx < 0 || idx as usize >= candidates.len() {
            return Err(p.error(
                &format!(
                    "`pick` returned index {idx}, but there are {} candidates",
                    candidates.len()
                ),
                None,
                req,
            ));
        }
        Ok(candidates[idx as usize])
    }
}

/// The two roles of an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Prefill = 0,
    Decode = 1,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}
