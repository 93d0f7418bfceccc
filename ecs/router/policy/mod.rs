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
//!
//! | file | what |
//! |---|---|
//! | [`sandbox`] | the one rhai engine: limits, native functions, `lib/` modules |
//! | [`views`] | what a script sees of the request and of each pod |
//! | [`plugin`] | one plugin: its script compiled, its hook, `params`, `state` |
//! | [`checks`] | what is refused at load, and how script errors read |
//! | [`memo`] | answers of pure hooks, remembered by what they read |
//! | [`direct`] | hooks the host evaluates itself, without the interpreter |

use rhai::{Array, Dynamic, Engine};
use std::path::Path;

use crate::engine::Role;
use crate::error::Result;
use crate::scenario;

pub mod checks;
pub(crate) mod direct;
mod memo;
pub mod plugin;
pub mod sandbox;
pub mod views;

use plugin::Inputs;
pub use plugin::{Hook, Plugin};
pub use views::{PodView, ReqView};

use sandbox::{new_engine, number};

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
    numbers: Vec<f64>,
}

/// The script values of a hook's arguments, made only when rhai runs it
/// (the host evaluates most hooks itself). Scripts get copies (plain
/// values, never shared ones: rhai's size limits refuse shared values
/// inside arrays and maps), so a copy kept in `state` does not change under
/// it.
fn req_arg(req: &ReqView) -> Dynamic {
    Dynamic::from(req.clone())
}

fn pods_arg(candidates: &[usize], pods: &[PodView]) -> Array {
    candidates
        .iter()
        .map(|&i| Dynamic::from(pods[i].clone()))
        .collect()
}

impl Profile {
    /// Its filters, scorers and picker, in the order they run.
    pub fn plugins(&self) -> impl Iterator<Item = &Plugin> {
        self.filters
            .iter()
            .chain(&self.scorers)
            .chain(std::iter::once(&self.picker))
    }

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
        let engine = new_engine(seed, lib, &router.script_limits)?;
        let policies = Policies {
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
            numbers: Vec::new(),
        };
        Ok(policies)
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
        Ok(())
    }

    /// Every plugin, the decider first.
    pub fn plugins(&self) -> impl Iterator<Item = &Plugin> {
        std::iter::once(&self.decider)
            .chain(self.decode.plugins())
            .chain(self.prefill.plugins())
    }

    /// Every hook runs on every call from now on: no answer of a pure hook
    /// is remembered ([`memo`]).
    pub fn forget_answers(&self) {
        self.plugins().for_each(Plugin::forget_answers);
    }

    /// The decider's verdict: prefill remotely? A decider of three
    /// arguments also sees the candidate prefill pods.
    pub fn decide(
        &mut self,
        req: &ReqView,
        pod: &PodView,
        prefill_pods: Option<&[PodView]>,
    ) -> Result<bool> {
        let d = &self.decider;
        let out = match prefill_pods {
            Some(pods) if d.arity == 3 => {
                let pods: Array = pods.iter().map(|p| Dynamic::from(p.clone())).collect();
                d.call(&self.engine, (req_arg(req), pod.clone(), pods), req)?
            }
            _ => {
                let inputs = Inputs {
                    pods: std::slice::from_ref(pod),
                    candidates: &[0],
                    scores: &[],
                };
                d.call_on(&self.engine, inputs, || (req_arg(req), pod.clone()), req)?
            }
        };
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
        let candidates = &mut self.candidates;
        candidates.clear();
        candidates.extend(0..pods.len());

        // Filters: each keeps a subset; keeping nobody is an error (a request
        // must go somewhere: llm-d's filters fall back to all themselves).
        for f in &profile.filters {
            let inputs = Inputs {
                pods,
                candidates,
                scores: &[],
            };
            let args = || (req_arg(req), pods_arg(candidates, pods));
            let direct = f.answer_directly(
                &self.engine,
                &inputs,
                req,
                &mut self.numbers,
                &mut self.kept,
                Some(args),
            );
            if direct.is_some() {
                std::mem::swap(candidates, &mut self.kept);
                continue;
            }
            let out = f.call(
                &self.engine,
                (req_arg(req), pods_arg(candidates, pods)),
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
                if next.contains(&pos) {
                    return Err(f.error(
                        &format!(
                            "`filter` returned pod {index} twice; it must return a subset of `pods`"
                        ),
                        None,
                        req,
                    ));
                }
                next.push(pos);
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
                let wrong_count = |n: usize| {
                    let pods = candidates.len();
                    let what = format!("`score_all` returned {n} scores for {pods} pods");
                    s.error(&what, None, req)
                };
                let inputs = Inputs {
                    pods,
                    candidates,
                    scores: &[],
                };
                let args = || (req_arg(req), pods_arg(candidates, pods));
                let numbers = &mut self.numbers;
                if s.answer_directly(
                    &self.engine,
                    &inputs,
                    req,
                    numbers,
                    &mut self.kept,
                    Some(args),
                )
                .is_some()
                {
                    if numbers.len() != candidates.len() {
                        return Err(wrong_count(numbers.len()));
                    }
                    for (k, &v) in numbers.iter().enumerate() {
                        add(k, &Dynamic::from_float(v), &mut self.scores)?;
                    }
                    continue;
                }
                let out = s.call_on(&self.engine, inputs, args, req)?;
                let arr = out.try_cast::<Array>().ok_or_else(|| {
                    s.error(
                        "`score_all` must return an array with one number per pod",
                        None,
                        req,
                    )
                })?;
                if arr.len() != candidates.len() {
                    return Err(wrong_count(arr.len()));
                }
                for (k, v) in arr.iter().enumerate() {
                    add(k, v, &mut self.scores)?;
                }
            } else {
                for (k, pod) in candidates.iter().enumerate() {
                    let inputs = Inputs {
                        pods,
                        candidates: std::slice::from_ref(pod),
                        scores: &[],
                    };
                    let args = || (req_arg(req), Dynamic::from(pods[*pod].clone()));
                    let out = s.call_on(&self.engine, inputs, args, req)?;
                    add(k, &out, &mut self.scores)?;
                }
            }
        }

        // Finite scores can still sum to ±inf (or inf − inf): the picker
        // would compare what is not a number.
        if let Some(k) = self.scores.iter().position(|v| !v.is_finite()) {
            let weights: Vec<String> = profile
                .scorers
                .iter()
                .map(|s| format!("{} × {}", s.weight, s.path))
                .collect();
            let last = profile.scorers.last().unwrap_or(&profile.picker);
            return Err(last.error(
                &format!(
                    "the weighted sum of the scores of pod {} is {} ({}): scores × weights overflow",
                    pods[candidates[k]].index,
                    self.scores[k],
                    weights.join(" + ")
                ),
                None,
                req,
            ));
        }
        let p = &profile.picker;
        let inputs = Inputs {
            pods,
            candidates,
            scores: &self.scores,
        };
        let args = || {
            let scores: Array = self
                .scores
                .iter()
                .map(|&v| Dynamic::from_float(v))
                .collect();
            (req_arg(req), pods_arg(candidates, pods), scores)
        };
        let out = p.call_on(&self.engine, inputs, args, req)?;
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

    /// Calls every hook on a few made-up situations (a short and a long
    /// prompt; idle and busy pods, with and without a cached prefix), so a
    /// script's runtime mistakes — a wrong return type, an endless loop, an
    /// error in a branch — show before a run (`pdsim check`). Plugins'
    /// `state` is touched: rehearse on policies that will not run.
    pub fn rehearse(&mut self) -> Result<()> {
        let pod = |role: &str, index: i64, busy: i64, cached: i64| PodView {
            role: role.into(),
            index,
            active: busy,
            running: busy.min(8),
            queued: (busy - 8).max(0),
            prompt_backlog: busy * 500,
            kv_capacity: 160_000,
            kv_held: busy * 2_000,
            cached_tokens: cached,
            max_num_seqs: 64,
            nic_flows: busy.min(2),
            nic_capacity: 200_000.0,
            nic_rate: busy.min(2) as f64 * 50_000.0,
            router_requests: busy,
            router_tokens: busy * 2_000,
            router_cached_tokens: cached,
            ..Default::default()
        };
        for (k, (prompt, cached, busy)) in
            [(200, 0, 0), (6_000, 0, 12), (6_000, 4_000, 3), (40, 32, 70)]
                .into_iter()
                .enumerate()
        {
            let req = ReqView {
                id: k as i64,
                session: 1,
                turn: k as i64,
                prompt_tokens: prompt,
                new_tokens: prompt - cached,
                block_size: 16,
                arrival_time: 10.0 * k as f64,
                now: 10.0 * k as f64 + 0.5,
            };
            let decoders = [pod("decode", 0, busy, cached), pod("decode", 1, 0, 0)];
            let prefillers = [pod("prefill", 0, busy / 2, cached), pod("prefill", 1, 1, 0)];
            self.choose(Role::Decode, &req, &decoders)?;
            for d in &decoders {
                self.decide(&req, d, Some(&prefillers))?;
            }
            self.choose(Role::Prefill, &req, &prefillers)?;
        }
        Ok(())
    }
}
