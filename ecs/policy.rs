//! Routing policies as rhai scripts: one sandboxed rhai engine, each plugin
//! (decider, filter, scorer, picker) a compiled script with its own
//! parameters. Hooks:
//!
//! | plugin  | hook                          | returns                      |
//! |---------|-------------------------------|------------------------------|
//! | decider | `fn decide(req, pod)`         | bool: prefill remotely?      |
//! | filter  | `fn filter(req, pods)`        | array: the pods kept         |
//! | scorer  | `fn score(req, pod)`          | number, documented in [0, 1] |
//! | picker  | `fn pick(req, pods, scores)`  | int: an index into `pods`    |
//!
//! Scripts are compiled once; their top level runs once (at load), and hooks
//! are called without re-running it. Parameters reach every hook as the
//! constant `params`, resolved per call from the call's tag, so one file can
//! serve several plugins with different parameters.

use rhai::{
    AST, Array, CallFnOptions, Dynamic, Engine, EvalAltResult, ImmutableString, Map, Scope,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::error::{Error, Result};
use crate::scenario::{self, ParamValue};

/// What a script sees of the request being routed.
#[derive(Clone, Debug, Default)]
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
    Pick,
}

impl Hook {
    pub fn name(self) -> &'static str {
        match self {
            Hook::Decide => "decide",
            Hook::Filter => "filter",
            Hook::Score => "score",
            Hook::Pick => "pick",
        }
    }
}

/// One configured plugin: a compiled script plus its parameters.
pub struct Plugin {
    pub path: String,
    pub hook: Hook,
    ast: AST,
    params: Dynamic,
    pub weight: f64,
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
    /// Scratch: candidate list and scores, reused across requests.
    scores: Vec<f64>,
}

/// Operations a single hook call may take before it is stopped.
pub const MAX_OPERATIONS: u64 = 1_000_000;

fn new_engine(seed: u64) -> Engine {
    let mut engine = Engine::new_raw();
    // Only pure computation: no file, network or time access exists in rhai's
    // standard packages, and no module resolver is installed.
    engine.register_global_module(rhai::packages::Package::as_shared_module(
        &rhai::packages::StandardPackage::new(),
    ));
    engine.set_strict_variables(true);
    engine.set_fail_on_invalid_map_property(true);
    engine.set_max_operations(MAX_OPERATIONS);
    engine.set_max_call_levels(64);
    engine.set_max_expr_depths(64, 64);
    engine.set_max_string_size(1 << 20);
    engine.set_max_array_size(1 << 16);
    engine.set_max_map_size(1 << 16);
    engine.set_optimization_level(rhai::OptimizationLevel::Simple);
    engine.on_print(|s| tracing::info!(target: "pdsim::script", "{s}"));
    engine.on_debug(
        |s, src, pos| tracing::debug!(target: "pdsim::script", "{}:{pos}: {s}", src.unwrap_or("")),
    );
    #[allow(deprecated)]
    engine.on_var(|name, _, ctx| {
        Ok(if name == "params" {
            Some(ctx.tag().clone())
        } else {
            None
        })
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
    let rng = Arc::new(Mutex::new(Xoshiro256PlusPlus::seed_from_u64(
        seed ^ 0x5EED_0F_20_07E5,
    )));
    let r = rng.clone();
    engine.register_fn("random", move || -> f64 {
        r.lock().unwrap().random::<f64>()
    });
    engine.register_fn("random_int", move |n: i64| -> i64 {
        if n <= 0 {
            0
        } else {
            rng.lock().unwrap().random_range(0..n)
        }
    });
    engine
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
        EvalAltResult::ErrorTooManyOperations(_) => format!(
            "the script ran more than {MAX_OPERATIONS} operations (an endless loop?) and was stopped"
        ),
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

impl Plugin {
    fn load(
        engine: &Engine,
        path: &str,
        hook: Hook,
        params: &BTreeMap<String, ParamValue>,
        weight: f64,
    ) -> Result<Plugin> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::new(format!("cannot read script {path}: {e}")))?;
        let mut scope = Scope::new();
        // Declared (not constant, so the optimizer does not inline it) for
        // strict-variable checking; its value comes from `on_var` per call.
        scope.push("params", Map::new());
        let mut ast = engine.compile_with_scope(&scope, &text).map_err(|e| {
            let line =
                e.1.line()
                    .map(|l| format!(", line {l}"))
                    .unwrap_or_default();
            Error::new(format!("script {path}{line}: syntax error: {}", e.0))
        })?;
        ast.set_source(path);
        let params = Dynamic::from_map(map_of(params)).into_shared();
        // Run the top level once (constants, setup), then keep only functions.
        engine
            .run_ast_with_scope(&mut Scope::new(), &ast)
            .map_err(|e| {
                Error::new(format!(
                    "script {path}, top level, line {}: {}",
                    error_line(&e).unwrap_or(0),
                    describe(&e)
                ))
            })?;
        ast.clear_statements();
        let arity = match hook {
            Hook::Pick => 3,
            _ => 2,
        };
        if !ast
            .iter_functions()
            .any(|f| f.name == hook.name() && f.params.len() == arity)
        {
            let expected = match hook {
                Hook::Decide => "fn decide(req, pod) -> bool",
                Hook::Filter => "fn filter(req, pods) -> array",
                Hook::Score => "fn score(req, pod) -> float",
                Hook::Pick => "fn pick(req, pods, scores) -> int",
            };
            return Err(Error::new(format!(
                "script {path}: it is used as a {} plugin but defines no `{expected}`",
                match hook {
                    Hook::Decide => "decider",
                    Hook::Filter => "filter",
                    Hook::Score => "scorer",
                    Hook::Pick => "picker",
                }
            )));
        }
        Ok(Plugin {
            path: path.to_string(),
            hook,
            ast,
            params,
            weight,
        })
    }

    fn call(&self, engine: &Engine, args: impl rhai::FuncArgs, req: &ReqView) -> Result<Dynamic> {
        let options = CallFnOptions::new()
            .eval_ast(false)
            .rewind_scope(false)
            .with_tag(self.params.clone());
        engine
            .call_fn_with_options::<Dynamic>(
                options,
                &mut Scope::new(),
                &self.ast,
                self.hook.name(),
                args,
            )
            .map_err(|e| self.error(&describe(&e), error_line(&e), req))
    }

    /// An error naming the script, the hook, the line and the request.
    pub fn error(&self, what: &str, line: Option<usize>, req: &ReqView) -> Error {
        let line = line.map(|l| format!(", line {l}")).unwrap_or_default();
        Error::new(format!(
            "script {}, hook `{}`{line}: {what} (while routing request {} of session {}, turn {})",
            self.path,
            self.hook.name(),
            req.id,
            req.session,
            req.turn
        ))
    }

    /// Replaces this plugin's parameters (hot swap).
    pub fn set_params(&mut self, params: &BTreeMap<String, ParamValue>) {
        self.params = Dynamic::from_map(map_of(params)).into_shared();
    }
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
    /// Compiles every script the router section names.
    pub fn load(router: &scenario::Router, seed: u64) -> Result<Policies> {
        let engine = new_engine(seed);
        Ok(Policies {
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
        })
    }

    /// Replaces every plugin whose configuration changed (hot swap); keeps the
    /// seeded random stream.
    pub fn reload(&mut self, router: &scenario::Router) -> Result<()> {
        let same = |p: &Plugin, s: &str| p.path == s;
        if same(&self.decider, &router.decider.script) {
            self.decider.set_params(&router.decider.params);
        } else {
            self.decider = Plugin::load(
                &self.engine,
                &router.decider.script,
                Hook::Decide,
                &router.decider.params,
                1.0,
            )?;
        }
        self.decode = Profile::load(&self.engine, &router.decode)?;
        self.prefill = Profile::load(&self.engine, &router.prefill)?;
        Ok(())
    }

    /// The decider's verdict: prefill remotely?
    pub fn decide(&self, req: &ReqView, pod: &PodView) -> Result<bool> {
        let d = &self.decider;
        let out = d.call(&self.engine, (req.clone(), pod.clone()), req)?;
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
        let profile = match role {
            Role::Decode => &self.decode,
            Role::Prefill => &self.prefill,
        };
        // Filters: each keeps a subset (by pod index); an empty result keeps
        // nobody, which is an error: a request must go somewhere.
        let mut candidates: Vec<usize> = (0..pods.len()).collect();
        for f in &profile.filters {
            let arr: Array = candidates
                .iter()
                .map(|&i| Dynamic::from(pods[i].clone()))
                .collect();
            let out = f.call(&self.engine, (req.clone(), arr), req)?;
            let kept = out
                .try_cast::<Array>()
                .ok_or_else(|| f.error("`filter` must return an array of pods", None, req))?;
            let mut next = Vec::with_capacity(kept.len());
            for k in kept {
                let pod = k.try_cast::<PodView>().ok_or_else(|| {
                    f.error(
                        "`filter` must return an array of pods (items of its `pods` argument)",
                        None,
                        req,
                    )
                })?;
                let pos = candidates
                    .iter()
                    .copied()
                    .find(|&i| pods[i].index == pod.index)
                    .ok_or_else(|| {
                        f.error(
                            &format!(
                                "`filter` returned pod {} which was not a candidate",
                                pod.index
                            ),
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
            candidates = next;
        }
        // Weighted sum of scores.
        self.scores.clear();
        self.scores.resize(candidates.len(), 0.0);
        for s in &profile.scorers {
            for (k, &i) in candidates.iter().enumerate() {
                let out = s.call(&self.engine, (req.clone(), pods[i].clone()), req)?;
                let v = number(&out).ok_or_else(|| {
                    s.error(
                        &format!(
                            "`score` must return a number, it returned {}",
                            out.type_name()
                        ),
                        None,
                        req,
                    )
                })?;
                if !v.is_finite() {
                    return Err(s.error(
                        &format!(
                            "`score` returned {v} for pod {}; scores must be finite",
                            pods[i].index
                        ),
                        None,
                        req,
                    ));
                }
                self.scores[k] += s.weight * v;
            }
        }
        let arr: Array = candidates
            .iter()
            .map(|&i| Dynamic::from(pods[i].clone()))
            .collect();
        let scores: Array = self
            .scores
            .iter()
            .map(|&v| Dynamic::from_float(v))
            .collect();
        let p = &profile.picker;
        let out = p.call(&self.engine, (req.clone(), arr, scores), req)?;
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
    Prefill,
    Decode,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

/// Loads a script file standing alone (for `pdsim check` and tests).
pub fn check_script(path: &Path, hook: Hook) -> Result<()> {
    let engine = new_engine(0);
    Plugin::load(
        &engine,
        &path.to_string_lossy(),
        hook,
        &BTreeMap::new(),
        1.0,
    )
    .map(|_| ())
}
