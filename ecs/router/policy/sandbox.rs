//! The one rhai engine every plugin runs in: pure computation only, strict
//! variables, an operation limit per call, `print`/`debug` to the log,
//! seeded `random`/`random_int`, a native `argmax`, and the modules of
//! `lib/` by file name.

use rhai::{Array, Dynamic, Engine, EvalAltResult, ImmutableString, Module, Scope};
use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::error::{Error, Result};
use crate::router::policy::checks::{check_length, describe, error_line};
use crate::router::policy::plugin::PluginEnv;
use crate::router::policy::views;
use crate::scenario::ScriptLimits;

pub fn new_engine(seed: u64, lib: Option<&Path>, limits: &ScriptLimits) -> Result<Engine> {
    let mut engine = Engine::new_raw();
    // Only pure computation: rhai's standard packages have no file, network
    // or time access, and no module resolver is installed (`import` fails).
    engine.register_global_module(rhai::packages::Package::as_shared_module(
        &rhai::packages::StandardPackage::new(),
    ));
    engine.set_strict_variables(true);
    engine.set_fail_on_invalid_map_property(true);
    // Per call; a size is checked whenever a value is built or changed, so
    // `s += s` in a loop stops at the limit, not at the allocator.
    engine.set_max_operations(limits.operations);
    engine.set_max_string_size(limits.string_bytes);
    engine.set_max_array_size(limits.array_items);
    engine.set_max_map_size(limits.map_entries);
    engine.set_max_call_levels(64);
    engine.set_max_expr_depths(64, 64);
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

    views::register(&mut engine);

    // Seeded randomness for policies (random tie-breaks, random pickers):
    // one stream per run, drawn in routing order, so runs are reproducible.
    let rng = Rc::new(RefCell::new(Xoshiro256PlusPlus::seed_from_u64(
        seed ^ 0x5EED_0F20_07E5,
    )));
    let r = rng.clone();
    engine.register_fn("random", move || -> f64 { r.borrow_mut().random::<f64>() });
    let r = rng.clone();
    // random_int(n): uniform in [0, n); there is no such integer for n < 1.
    engine.register_fn(
        "random_int",
        move |n: i64| -> std::result::Result<i64, Box<EvalAltResult>> {
            if n < 1 {
                return Err(format!(
                    "random_int(n) draws from [0, n): n must be at least 1, got {n}"
                )
                .into());
            }
            Ok(r.borrow_mut().random_range(0..n))
        },
    );
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
            check_length(&text, &format!("script module {}", path.display()))?;
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
                    describe(&e, &engine)
                ))
            })?;
            engine.register_static_module(name.as_str(), module.into());
        }
    }
    Ok(engine)
}

pub(crate) fn number(v: &Dynamic) -> Option<f64> {
    v.as_float()
        .ok()
        .or_else(|| v.as_int().ok().map(|i| i as f64))
}
