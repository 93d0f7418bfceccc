//! Answers of pure hooks, remembered by what they read (an exact shortcut).
//!
//! A hook is *pure* when its answer depends only on the properties it reads
//! of its arguments, the number of candidate pods and the scores: its body
//! (checked at load, [`pure_reads`]) reads the request and the pods only
//! as `x.property` (and `pods.len()`, `pods[i].property`, `for p in pods`),
//! touches no `state`, calls only functions without side effects or
//! randomness, and defines no closure. Its `params` are constants folded
//! into the body. Called again with the same values of what it reads (bit
//! for bit), it would compute the same answer, so the remembered one is
//! returned. The active-request scorer of the reference profiles, a
//! `score_all` over the decode pods' `active`, mostly sees a few small
//! counts, and it is most of a decision's time.
//!
//! A hook whose inputs seldom repeat (a decider reading the prompt length)
//! stops being remembered after [`TRIAL`] calls with few repeats, so it
//! costs a few look-ups at most.

use rhai::{AST, ASTNode, Dynamic, Expr, ImmutableString, Stmt};
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use crate::engine::kv::KeyHasher;

use crate::router::policy::Hook;
use crate::router::policy::views::{PodView, ReqView};

/// A property's value as bits (the key compares values exactly).
type Field<T> = fn(&T) -> u64;

/// What a pure hook reads: properties of the request and of each pod, and
/// whether the scores.
pub(crate) struct Reads {
    req: Vec<Field<ReqView>>,
    pod: Vec<Field<PodView>>,
    /// Whether `role` is among the pod's properties read.
    role: bool,
    scores: bool,
}

fn req_field(name: &str) -> Option<Field<ReqView>> {
    Some(match name {
        "id" => |r| r.id as u64,
        "session" => |r| r.session as u64,
        "turn" => |r| r.turn as u64,
        "prompt_tokens" => |r| r.prompt_tokens as u64,
        "new_tokens" => |r| r.new_tokens as u64,
        "block_size" => |r| r.block_size as u64,
        "arrival_time" => |r| r.arrival_time.to_bits(),
        "now" => |r| r.now.to_bits(),
        _ => return None,
    })
}

/// A role name of up to 7 bytes (`prefill`, `decode`) packed with its
/// length; a call with a longer one is not remembered ([`Memo::look_up`]).
fn role_bits(role: &ImmutableString) -> u64 {
    let b = role.as_bytes();
    b.iter()
        .fold(b.len() as u64, |acc, &c| (acc << 8) | c as u64)
}

fn pod_field(name: &str) -> Option<Field<PodView>> {
    Some(match name {
        "role" => |p| role_bits(&p.role),
        "index" => |p| p.index as u64,
        "active" => |p| p.active as u64,
        "running" => |p| p.running as u64,
        "queued" => |p| p.queued as u64,
        "parked" => |p| p.parked as u64,
        "prompt_backlog" => |p| p.prompt_backlog as u64,
        "kv_capacity" => |p| p.kv_capacity as u64,
        "kv_held" => |p| p.kv_held as u64,
        "kv_free_cached" => |p| p.kv_free_cached as u64,
        "cached_tokens" => |p| p.cached_tokens as u64,
        "max_num_seqs" => |p| p.max_num_seqs as u64,
        "nic_flows" => |p| p.nic_flows as u64,
        "nic_capacity" => |p| p.nic_capacity.to_bits(),
        "nic_rate" => |p| p.nic_rate.to_bits(),
        "router_requests" => |p| p.router_requests as u64,
        "router_tokens" => |p| p.router_tokens as u64,
        "router_cached_tokens" => |p| p.router_cached_tokens as u64,
        _ => return None,
    })
}

/// Functions a pure hook may call: operators and rhai's arithmetic,
/// conversions and array look-ups (none has a side effect outside its
/// arguments, none draws a random number). `argmax` is pure when its ties
/// go to the first (checked where it is called).
const PURE_FUNCTIONS: &[&str] = &[
    "+",
    "-",
    "*",
    "/",
    "%",
    "**",
    "==",
    "!=",
    "<",
    "<=",
    ">",
    ">=",
    "!",
    "&",
    "|",
    "^",
    "<<",
    ">>",
    "..",
    "..=",
    "to_float",
    "to_int",
    "abs",
    "floor",
    "ceiling",
    "round",
    "int",
    "fraction",
    "sqrt",
    "exp",
    "ln",
    "log",
    "sign",
    "is_zero",
    "is_nan",
    "is_finite",
    "is_infinite",
    "min",
    "max",
    "len",
    "is_empty",
    "push",
    "contains",
    "argmax",
];

/// What a hook's argument is.
#[derive(Clone, Copy, PartialEq)]
enum Arg {
    Req,
    Pod,
    Pods,
    Scores,
}

/// What `hook` reads when its body is pure, else None (see the module docs).
/// `args` are the hook's parameter names, in order.
pub(crate) fn pure_reads(body: &AST, hook: Hook, args: &[ImmutableString]) -> Option<Reads> {
    let mut names: Vec<(ImmutableString, Arg)> = Vec::new();
    for (i, name) in args.iter().enumerate() {
        let kind = match (hook, i) {
            (_, 0) => Arg::Req,
            (Hook::Decide | Hook::Score, 1) => Arg::Pod,
            (Hook::ScoreAll | Hook::Pick, 1) => Arg::Pods,
            (Hook::Pick, 2) => Arg::Scores,
            // A filter answers with pods; a decider's prefill pods are not
            // keyed.
            _ => return None,
        };
        names.push((name.clone(), kind));
    }
    if hook == Hook::Filter {
        return None;
    }
    // Names the body declares; loop variables over the pods are pods. A
    // declared name equal to an argument's would make the rules below
    // ambiguous: such a body is not remembered.
    let mut declared: Vec<(ImmutableString, bool)> = Vec::new();
    body.walk(&mut |nodes: &[ASTNode]| {
        match nodes.last() {
            Some(ASTNode::Stmt(Stmt::Var(x, ..))) => declared.push((x.0.name.clone(), false)),
            Some(ASTNode::Stmt(Stmt::For(x, _))) => {
                let over_pods = matches!(&x.2.expr, Expr::Variable(v, ..)
                    if names.iter().any(|(n, k)| *k == Arg::Pods && *n == v.1));
                declared.push((x.0.name.clone(), over_pods));
                if let Some(counter) = &x.1 {
                    declared.push((counter.name.clone(), false));
                }
            }
            _ => {}
        }
        true
    });
    let mut locals: Vec<ImmutableString> = Vec::new();
    for (name, is_pod) in declared {
        let known = names.iter().find(|(n, _)| *n == name).map(|x| x.1);
        match (known, is_pod) {
            // A loop variable over the pods again (`for p in pods` twice).
            (Some(Arg::Pod), true) if args.iter().all(|a| *a != name) => {}
            (Some(_), _) => return None,
            (None, true) => names.push((name, Arg::Pod)),
            (None, false) => {
                if !locals.contains(&name) {
                    locals.push(name);
                }
            }
        }
    }
    if locals.iter().any(|l| names.iter().any(|(n, _)| n == l)) {
        return None;
    }
    let kind_of = |e: &Expr| match e {
        Expr::Variable(v, ..) => names.iter().find(|(n, _)| *n == v.1).map(|x| x.1),
        _ => None,
    };
    let mut reads = Reads {
        req: Vec::new(),
        pod: Vec::new(),
        role: false,
        scores: false,
    };
    let (mut req_props, mut pod_props): (Vec<ImmutableString>, Vec<ImmutableString>) =
        (Vec::new(), Vec::new());
    let mut pure = true;
    body.walk(&mut |nodes: &[ASTNode]| {
        let parent = nodes.len().checked_sub(2).map(|i| &nodes[i]);
        let ok = match nodes.last() {
            Some(ASTNode::Stmt(s)) => match s {
                Stmt::Noop(_)
                | Stmt::If(..)
                | Stmt::Switch(..)
                | Stmt::While(..)
                | Stmt::Do(..)
                | Stmt::For(..)
                | Stmt::Var(..)
                | Stmt::Block(..)
                | Stmt::Expr(..)
                | Stmt::BreakLoop(..)
                | Stmt::Return(..) => true,
                // Assignments only to what the body declared.
                Stmt::Assignment(x) => root_name(&x.1.lhs).is_some_and(|n| locals.contains(n)),
                Stmt::FnCall(f, _) => pure_call(f),
                _ => false,
            },
            Some(ASTNode::Expr(e)) => match e {
                Expr::DynamicConstant(..)
                | Expr::BoolConstant(..)
                | Expr::IntegerConstant(..)
                | Expr::FloatConstant(..)
                | Expr::CharConstant(..)
                | Expr::StringConstant(..)
                | Expr::InterpolatedString(..)
                | Expr::Array(..)
                | Expr::Map(..)
                | Expr::Unit(..)
                | Expr::Property(..)
                | Expr::Stmt(..)
                | Expr::Dot(..)
                | Expr::Index(..)
                | Expr::And(..)
                | Expr::Or(..)
                | Expr::Coalesce(..) => true,
                Expr::FnCall(f, _) | Expr::MethodCall(f, _) => pure_call(f),
                Expr::Variable(v, ..) => match kind_of(e) {
                    None => locals.contains(&v.1),
                    Some(Arg::Scores) => {
                        reads.scores = true;
                        true
                    }
                    Some(kind) => {
                        // Read only as `x.property`; the pods also as
                        // `pods.len()`, `pods[i].property` and `for p in pods`.
                        match parent {
                            Some(ASTNode::Expr(Expr::Dot(x, ..)))
                                if std::ptr::eq(&x.lhs, *e) && kind != Arg::Pods =>
                            {
                                match first_property_of_chain(&x.rhs) {
                                    Some(p) if kind == Arg::Req => {
                                        req_props.push(p);
                                        true
                                    }
                                    Some(p) => {
                                        pod_props.push(p);
                                        true
                                    }
                                    None => false,
                                }
                            }
                            Some(ASTNode::Expr(Expr::Dot(x, ..))) if std::ptr::eq(&x.lhs, *e) => {
                                matches!(&x.rhs, Expr::MethodCall(f, _)
                                    if f.args.is_empty() && matches!(f.name.as_str(), "len" | "is_empty"))
                            }
                            Some(ASTNode::Stmt(Stmt::For(x, _))) if kind == Arg::Pods => {
                                std::ptr::eq(&x.2.expr, *e)
                            }
                            Some(ASTNode::Expr(Expr::Index(x, ..)))
                                if kind == Arg::Pods && std::ptr::eq(&x.lhs, *e) =>
                            {
                                // `pods[i].p` is Index(pods, Dot(i, p…)): the
                                // pod must be read as `.property`.
                                match &x.rhs {
                                    Expr::Dot(y, ..) => match first_property_of_chain(&y.rhs) {
                                        Some(p) => {
                                            pod_props.push(p);
                                            true
                                        }
                                        None => false,
                                    },
                                    _ => false,
                                }
                            }
                            _ => false,
                        }
                    }
                },
                _ => false,
            },
            _ => false,
        };
        if !ok {
            pure = false;
        }
        ok
    });
    if !pure {
        return None;
    }
    req_props.sort();
    req_props.dedup();
    pod_props.sort();
    pod_props.dedup();
    for p in &req_props {
        reads.req.push(req_field(p)?);
    }
    for p in &pod_props {
        reads.pod.push(pod_field(p)?);
    }
    reads.role = pod_props.iter().any(|p| p == "role");
    Some(reads)
}

/// The property a chain after `x.` reads of `x` (`p`, `p.f()`, `p[i]`).
fn first_property_of_chain(rhs: &Expr) -> Option<ImmutableString> {
    match rhs {
        Expr::Property(p, _) => Some(p.2.clone()),
        Expr::Dot(y, ..) | Expr::Index(y, ..) => match &y.lhs {
            Expr::Property(p, _) => Some(p.2.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// The variable an assignment's target is rooted at (`x`, `x[i]`, `x.p`).
fn root_name(e: &Expr) -> Option<&ImmutableString> {
    match e {
        Expr::Variable(v, ..) => Some(&v.1),
        Expr::Index(x, ..) | Expr::Dot(x, ..) => root_name(&x.lhs),
        _ => None,
    }
}

/// Whether the script defines a function named as one of
/// [`PURE_FUNCTIONS`] (`fn abs(x)`): a call of that name would run it.
pub(crate) fn redefines_pure_function(script: &AST) -> bool {
    script
        .iter_functions()
        .any(|f| PURE_FUNCTIONS.contains(&f.name))
}

fn pure_call(f: &rhai::FnCallExpr) -> bool {
    if !f.namespace.is_empty() || !PURE_FUNCTIONS.contains(&f.name.as_str()) {
        return false;
    }
    // argmax(scores, ties) is pure when ties go to the first.
    f.name != "argmax" || matches!(f.args.get(1), Some(Expr::StringConstant(s, _)) if s == "first")
}

/// Calls after which a hook whose inputs seldom repeat is no longer
/// remembered, and the share of repeats it must reach by then.
pub(crate) const TRIAL: u64 = 256;
const MIN_REPEATS_IN_TRIAL: u64 = TRIAL / 4;
/// Answers kept at most (a bound on memory; the first ones are kept).
const MAX_ANSWERS: usize = 1 << 14;

/// The remembered answers of one pure hook.
pub(crate) struct Memo {
    reads: Reads,
    /// Keyed with the pools' multiply-rotate hash (the keys are few small
    /// numbers; no adversary picks them).
    answers: HashMap<Box<[u64]>, Dynamic, BuildHasherDefault<KeyHasher>>,
    key: Vec<u64>,
    /// Whether the last look-up's key is complete.
    keyed: bool,
    calls: u64,
    pub(crate) repeats: u64,
}

impl Memo {
    pub(crate) fn new(reads: Reads) -> Memo {
        Memo {
            reads,
            answers: HashMap::default(),
            key: Vec::new(),
            keyed: false,
            calls: 0,
            repeats: 0,
        }
    }

    /// Whether answers are still looked up (not after a trial with few repeats).
    pub(crate) fn active(&self) -> bool {
        self.calls < TRIAL || self.repeats >= MIN_REPEATS_IN_TRIAL
    }

    /// The remembered answer for these inputs, if any; otherwise the key is
    /// kept for [`Self::remember`] (none when a role name is too long to key).
    pub(crate) fn look_up<'a>(
        &mut self,
        req: &ReqView,
        pods: impl ExactSizeIterator<Item = &'a PodView>,
        scores: &[f64],
    ) -> Option<Dynamic> {
        self.find(req, pods, scores).cloned()
    }

    /// [`Self::look_up`] without a copy of the answer.
    pub(crate) fn find<'a>(
        &mut self,
        req: &ReqView,
        pods: impl ExactSizeIterator<Item = &'a PodView>,
        scores: &[f64],
    ) -> Option<&Dynamic> {
        self.calls += 1;
        self.keyed = true;
        let key = &mut self.key;
        key.clear();
        key.push(pods.len() as u64);
        key.extend(self.reads.req.iter().map(|f| f(req)));
        for p in pods {
            if self.reads.role && p.role.len() > 7 {
                self.keyed = false;
                return None;
            }
            key.extend(self.reads.pod.iter().map(|f| f(p)));
        }
        if self.reads.scores {
            key.extend(scores.iter().map(|s| s.to_bits()));
        }
        let answer = self.answers.get(key.as_slice())?;
        self.repeats += 1;
        Some(answer)
    }

    /// Keeps the answer computed for the inputs of the last look-up.
    pub(crate) fn remember(&mut self, answer: &Dynamic) {
        if self.keyed && self.answers.len() < MAX_ANSWERS {
            self.answers
                .insert(self.key.as_slice().into(), answer.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::policy::plugin::Inputs;
    use crate::router::policy::{Plugin, sandbox};
    use crate::scenario::ParamValue;
    use rand::{RngExt, SeedableRng};
    use std::collections::BTreeMap;

    /// `script` loaded as the `hook` plugin (with `params`), on `engine`.
    fn load(engine: &rhai::Engine, hook: Hook, script: &str, params: &[(&str, &str)]) -> Plugin {
        let params: BTreeMap<String, ParamValue> = params
            .iter()
            .map(|(k, v)| (k.to_string(), ParamValue::Str(v.to_string())))
            .collect();
        Plugin::from_text(engine, "test.rhai", script, hook, &params, 1.0)
            .unwrap_or_else(|e| panic!("{script}: {e}"))
    }

    /// Whether `hook` of `script` (with `params`) has its answers remembered.
    fn remembered(hook: Hook, script: &str, params: &[(&str, &str)]) -> bool {
        let lib = std::path::Path::new("lib");
        let engine = sandbox::new_engine(1, Some(lib), &Default::default()).unwrap();
        load(&engine, hook, script, params).remembers()
    }

    /// A hook of signature `signature` (`score(req, pod)`) with `body`.
    fn hook(signature: &str, body: &str) -> String {
        format!("fn {signature} {{ {body} }}")
    }

    fn catalogue(name: &str) -> String {
        std::fs::read_to_string(format!("scripts/{name}.rhai")).unwrap()
    }

    #[test]
    fn every_property_a_script_may_read_has_its_bits_in_the_key() {
        use crate::router::policy::views::{POD_PROPERTIES, REQ_PROPERTIES};
        for p in REQ_PROPERTIES {
            assert!(req_field(p).is_some(), "request property {p}");
        }
        // Each pod field keys its own value: a view with every field set to
        // a distinct number gives distinct bits.
        let pod = PodView {
            role: "decode".into(),
            index: 1,
            active: 2,
            running: 3,
            queued: 4,
            parked: 5,
            prompt_backlog: 6,
            kv_capacity: 7,
            kv_held: 8,
            kv_free_cached: 9,
            cached_tokens: 10,
            max_num_seqs: 11,
            nic_flows: 12,
            nic_capacity: 13.0,
            nic_rate: 14.0,
            router_requests: 15,
            router_tokens: 16,
            router_cached_tokens: 17,
        };
        let bits: std::collections::HashSet<u64> = POD_PROPERTIES
            .iter()
            .map(|p| pod_field(p).unwrap_or_else(|| panic!("pod property {p}"))(&pod))
            .collect();
        assert_eq!(bits.len(), POD_PROPERTIES.len());
        assert_ne!(role_bits(&"decode".into()), role_bits(&"prefill".into()));
    }

    #[test]
    fn the_catalogue_hooks_that_read_only_their_arguments_are_remembered() {
        let pure = [
            (Hook::Score, "active-request-scorer", vec![]),
            (Hook::Score, "token-load-scorer", vec![]),
            (Hook::Score, "token-load-scorer", vec![("source", "router")]),
            (Hook::Score, "queue-scorer", vec![]),
            (Hook::Score, "kv-cache-utilization-scorer", vec![]),
            (Hook::Decide, "prefix-based-pd-decider", vec![]),
            (Hook::Decide, "always-disagg-pd-decider", vec![]),
            (Hook::Pick, "max-score-picker", vec![("ties", "first")]),
        ];
        for (hook, name, params) in pure {
            assert!(
                remembered(hook, &catalogue(name), &params),
                "{name} {params:?}"
            );
        }
        // Random tie-breaks, a round-robin counter in `state`, random picks;
        // a filter answers with pods; a call into a module of lib/.
        let not = [
            (Hook::Score, "prefix-cache-scorer", vec![]),
            (Hook::Pick, "max-score-picker", vec![("ties", "random")]),
            (Hook::Pick, "round-robin-picker", vec![]),
            (Hook::Pick, "random-picker", vec![]),
            (Hook::Filter, "prefix-cache-affinity-filter", vec![]),
        ];
        for (hook, name, params) in not {
            assert!(
                !remembered(hook, &catalogue(name), &params),
                "{name} {params:?}"
            );
        }
    }

    #[test]
    fn a_hook_with_any_other_input_or_effect_is_not_remembered() {
        let score = |body: &str| remembered(Hook::Score, &hook("score(req, pod)", body), &[]);
        // Pure: properties, locals, loops, pure functions.
        assert!(score(
            "let x = pod.active; let y = [1, 2]; y.push(x); x.to_float() / (y.len() + req.prompt_tokens)"
        ));
        assert!(score(
            "let s = 0; for i in 0..3 { s += i; } if pod.role == \"decode\" { s } else { 0 }"
        ));
        // Not: state, printing, randomness, a pod kept as a value, a shadowed
        // argument, an unknown function, a closure.
        assert!(!score("state.n = 1; 1.0"));
        assert!(!score("print(pod.active); 1.0"));
        assert!(!score("random()"));
        assert!(!score("let a = []; a.push(pod); 1.0"));
        assert!(!score("let pod = 1; 1.0"));
        assert!(!score("let x = pod.active; x.to_string().len().to_float()"));
        assert!(!score("let f = |x| x + 1; f.call(1)"));
        // A function of the script named as a pure one would run instead.
        assert!(!remembered(
            Hook::Score,
            "fn abs(x) { state.n = 1; x }\nfn score(req, pod) { abs(pod.active) }",
            &[]
        ));
        // The pods of a score_all only through their properties and length.
        let all = |body: &str| remembered(Hook::ScoreAll, &hook("score_all(req, pods)", body), &[]);
        assert!(all(
            "let s = []; for p in pods { s.push(p.active); } for p in pods { s.push(p.queued); } s"
        ));
        assert!(all(
            "let s = []; for i in 0..pods.len() { s.push(pods[i].running); } s"
        ));
        assert!(!all(
            "let s = []; for i in 0..pods.len() { let p = pods[i]; s.push(p.running); } s"
        ));
        assert!(!all("pods.map(|p| p.active)"));
    }

    #[test]
    fn a_score_all_the_host_evaluates_is_remembered_too() {
        // The reference's decode scorer (idle threshold 0): `active` 2 and
        // 4 give max 4, so (4 − 2) / 4.0 = 0.5 and (4 − 4) / 4.0 = 0.0.
        let engine = sandbox::new_engine(1, None, &Default::default()).unwrap();
        let scorer = load(
            &engine,
            Hook::ScoreAll,
            &catalogue("active-request-scorer"),
            &[("source", "pods")],
        );
        assert!(scorer.remembers() && scorer.direct.is_some());
        let pod = |active| PodView {
            active,
            ..Default::default()
        };
        let req = ReqView::default();
        let score = |pods: &[PodView]| {
            let (mut numbers, mut kept) = (Vec::new(), Vec::new());
            let inputs = Inputs {
                pods,
                candidates: &[0, 1],
                scores: &[],
            };
            let none = None::<fn() -> (Dynamic, rhai::Array)>;
            scorer.answer_directly(&engine, &inputs, &req, &mut numbers, &mut kept, none);
            let repeats = scorer.memo.borrow().as_ref().map(|m| m.repeats);
            (numbers, repeats)
        };
        let (a, b) = ([pod(2), pod(4)], [pod(4), pod(2)]);
        // Computed, then remembered; other inputs are computed again.
        assert_eq!(score(&a), (vec![0.5, 0.0], Some(0)));
        assert_eq!(score(&a), (vec![0.5, 0.0], Some(1)));
        assert_eq!(score(&b), (vec![0.0, 0.5], Some(1)));
        assert_eq!(score(&b), (vec![0.0, 0.5], Some(2)));
        // What the hook does not read is not in the key.
        let c = [
            PodView {
                queued: 9,
                ..pod(2)
            },
            pod(4),
        ];
        assert_eq!(score(&c), (vec![0.5, 0.0], Some(3)));
    }

    #[test]
    fn a_remembered_answer_is_the_answer_the_script_gives() {
        // score_all hooks reading pod properties directly, through an index
        // computed from another property or from the request, in a while
        // loop, by role: over inputs drawn from a few values, each
        // remembered answer must be the script's own, whatever the
        // properties the hook does not read.
        let scripts = [
            "let s = [];
             for i in 0..pods.len() { s.push(pods[i].running * 10 + req.turn); }
             let k = 0;
             for p in pods { s[k] = s[k] - p.active.to_float() / 3.0; k += 1; }
             s",
            "let s = []; for p in pods { s.push(pods[p.index % pods.len()].queued % 3); } s",
            "let s = []; for i in 0..pods.len() { s.push(pods[req.turn % pods.len()].active); } s",
            "let s = []; let j = 0;
             while j < pods.len() {
                 s.push(if pods[j].role == \"decode\" { 1.0 } else { pods[j].running.to_float() });
                 j += 1;
             }
             s",
        ];
        let engine = sandbox::new_engine(1, None, &Default::default()).unwrap();
        for (n, body) in scripts.iter().enumerate() {
            let script = hook("score_all(req, pods)", body);
            let fresh = || load(&engine, Hook::Score, &script, &[]);
            let (remembering, plain) = (fresh(), fresh());
            plain.forget_answers();
            assert!(remembering.remembers(), "script {n} is pure");
            let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(7);
            for id in 0..3000 {
                let req = ReqView {
                    id,
                    turn: rng.random_range(0..3),
                    prompt_tokens: rng.random_range(0..1000),
                    ..Default::default()
                };
                let pods: Vec<PodView> = (0..3)
                    .map(|_| PodView {
                        role: if rng.random_range(0..2) == 0 {
                            "decode"
                        } else {
                            "prefill"
                        }
                        .into(),
                        index: rng.random_range(0..3),
                        running: rng.random_range(0..2),
                        active: rng.random_range(0..2),
                        queued: rng.random_range(0..4),
                        prompt_backlog: rng.random_range(0..1000),
                        ..Default::default()
                    })
                    .collect();
                let candidates: Vec<usize> = (0..rng.random_range(1..=3)).collect();
                let inputs = || Inputs {
                    pods: &pods,
                    candidates: &candidates,
                    scores: &[],
                };
                let args = || {
                    let arr: rhai::Array = candidates
                        .iter()
                        .map(|&i| Dynamic::from(pods[i].clone()))
                        .collect();
                    (Dynamic::from(req.clone()), arr)
                };
                let a = remembering.call_on(&engine, inputs(), args, &req).unwrap();
                let b = plain.call_on(&engine, inputs(), args, &req).unwrap();
                assert_eq!(format!("{a:?}"), format!("{b:?}"), "script {n}, call {id}");
            }
            let memo = remembering.memo.borrow();
            let memo = memo.as_ref().expect("its inputs repeat");
            assert!(memo.repeats > 1000, "script {n}: {} repeats", memo.repeats);
        }
    }
}
