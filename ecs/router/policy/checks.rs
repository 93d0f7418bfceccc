//! What is checked of a script at load (parameters it reads, assignments to
//! `params`, whether it keeps `state`), and how rhai's errors are turned into
//! the script's error (its line, in nested calls too).

use rhai::{AST, Engine, EvalAltResult, Map};

use crate::error::{Error, Result};

/// The line an error happened at, looking inside nested function calls.
pub(crate) fn error_line(err: &EvalAltResult) -> Option<usize> {
    match err {
        EvalAltResult::ErrorInFunctionCall(_, _, inner, pos) => error_line(inner).or(pos.line()),
        other => other.position().line(),
    }
}

/// Lines a script may have: rhai numbers positions with 16 bits, and past
/// that its line numbers (and so its errors) would be wrong.
pub(crate) const MAX_SCRIPT_LINES: usize = u16::MAX as usize;

/// Refuses a script too long for rhai's positions.
pub(crate) fn check_length(text: &str, what: &str) -> Result<()> {
    let lines = text.lines().count();
    if lines > MAX_SCRIPT_LINES {
        return Err(Error::new(format!(
            "{what} has {lines} lines; rhai numbers lines with 16 bits, so a script may have at most \
             {MAX_SCRIPT_LINES}: split it into modules in lib/"
        )));
    }
    Ok(())
}

/// A rhai error as a sentence; a limit names the setting that raises it.
pub(crate) fn describe(err: &EvalAltResult, engine: &Engine) -> String {
    match err {
        EvalAltResult::ErrorInFunctionCall(_, _, inner, _) => describe(inner, engine),
        EvalAltResult::ErrorTooManyOperations(_) => format!(
            "the script ran more than {} operations (an endless loop?) and was stopped \
             (router.script_limits.operations)",
            engine.max_operations()
        ),
        EvalAltResult::ErrorStackOverflow(_) => format!(
            "functions called more than {} deep (an endless recursion?); the script was stopped",
            engine.max_call_levels()
        ),
        EvalAltResult::ErrorDataTooLarge(what, _) => {
            let (setting, limit) = if what.starts_with("Length of string") {
                ("string_bytes", engine.max_string_size())
            } else if what.starts_with("Size of array") {
                ("array_items", engine.max_array_size())
            } else {
                ("map_entries", engine.max_map_size())
            };
            format!(
                "{what} went over the limit of {limit} (router.script_limits.{setting}); the script was stopped"
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

/// Refuses a script that reads a parameter which neither its `DEFAULTS` nor
/// the scenario gives, or that assigns to `params`. Hooks read parameters
/// as folded constants, so a misspelt name is caught here, at load, rather
/// than read as `()`. (`params?.x` is an explicitly optional read and is not
/// checked.)
pub(crate) fn check_params_use(ast: &AST, params: &Map, path: &str) -> Result<()> {
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

/// The parameter names a script reads (`params.x`, `params?.x`, `params["x"]`).
fn params_read(ast: &AST) -> std::collections::BTreeSet<String> {
    use rhai::{ASTNode, Expr};
    let mut out = std::collections::BTreeSet::new();
    ast.walk(&mut |nodes: &[ASTNode]| {
        if let Some(ASTNode::Expr(Expr::Dot(x, ..) | Expr::Index(x, ..))) = nodes.last()
            && matches!(&x.lhs, Expr::Variable(v, ..) if v.1 == "params")
        {
            let name = match &x.rhs {
                Expr::Property(p, _) => Some(p.2.to_string()),
                Expr::StringConstant(s, _) => Some(s.to_string()),
                Expr::Dot(y, ..) | Expr::Index(y, ..) => match &y.lhs {
                    Expr::Property(p, _) => Some(p.2.to_string()),
                    Expr::StringConstant(s, _) => Some(s.to_string()),
                    _ => None,
                },
                _ => None,
            };
            out.extend(name);
        }
        true
    });
    out
}

/// What kind of value a parameter is, for comparing a scenario's value with
/// the script's default (integers and floats are both numbers: `inf` may
/// stand for "never").
fn kind_of(v: &rhai::Dynamic) -> &'static str {
    if v.is_int() || v.is_float() {
        "a number"
    } else if v.is_bool() {
        "a boolean"
    } else if v.is_string() {
        "a string"
    } else if v.is_array() {
        "a list"
    } else if v.is_map() {
        "a map"
    } else {
        "a value"
    }
}

/// Refuses a scenario parameter that the script neither declares in its
/// `DEFAULTS` nor reads (a misspelling would otherwise be ignored and the
/// default used), and a value of another kind than its default's.
pub(crate) fn check_given_params(ast: &AST, defaults: &Map, given: &Map, path: &str) -> Result<()> {
    let read = params_read(ast);
    let known: Vec<String> = defaults
        .keys()
        .map(|k| k.to_string())
        .chain(read.iter().cloned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    for (name, value) in given {
        let name = name.as_str();
        match defaults.get(name) {
            Some(default) => {
                let (want, got) = (kind_of(default), kind_of(value));
                if want != got {
                    return Err(Error::new(format!(
                        "script {path}: parameter `{name}` is {got} ({value}), but its default is {want} ({default})"
                    )));
                }
            }
            None if read.contains(name) => {}
            None => {
                let hint = crate::error::suggest(name, known.iter().map(String::as_str))
                    .map(|s| format!(" (did you mean `{s}`?)"))
                    .unwrap_or_default();
                return Err(Error::new(format!(
                    "script {path}: parameter `{name}` is neither declared in its `DEFAULTS` nor read{hint}; its parameters are {}",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known
                            .iter()
                            .map(|k| format!("`{k}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                )));
            }
        }
    }
    Ok(())
}

/// What a hook's argument is, for checking the properties read of it.
#[derive(Clone, Copy, PartialEq)]
enum Arg {
    Req,
    Pod,
    Pods,
}

/// Refuses a hook that reads a property the request or a pod does not
/// have (`pod.runing`), in any branch, naming the nearest one. The hook's
/// arguments are known by position (the request; a pod, or an array of
/// pods); so are `for p in pods` loop variables and `pods[i]`.
pub(crate) fn check_properties(
    body: &AST,
    hook: crate::router::policy::Hook,
    args: &[rhai::ImmutableString],
    path: &str,
) -> Result<()> {
    use crate::router::policy::Hook;
    use crate::router::policy::views::{POD_PROPERTIES, REQ_PROPERTIES};
    use rhai::{ASTNode, Expr, Stmt};
    let mut kinds: Vec<(String, Arg)> = Vec::new();
    for (i, name) in args.iter().enumerate() {
        let kind = match (hook, i) {
            (_, 0) => Arg::Req,
            (Hook::Decide | Hook::Score, 1) => Arg::Pod,
            (Hook::Decide, 2) | (Hook::Filter | Hook::ScoreAll | Hook::Pick, 1) => Arg::Pods,
            _ => continue,
        };
        kinds.push((name.to_string(), kind));
    }
    // Loop variables over an array of pods are pods.
    body.walk(&mut |nodes: &[ASTNode]| {
        if let Some(ASTNode::Stmt(Stmt::For(x, _))) = nodes.last()
            && let Expr::Variable(v, ..) = &x.2.expr
            && kinds
                .iter()
                .any(|(n, k)| *k == Arg::Pods && n == v.1.as_str())
        {
            kinds.push((x.0.name.to_string(), Arg::Pod));
        }
        true
    });
    let kind_of = |e: &Expr| -> Option<Arg> {
        match e {
            Expr::Variable(v, ..) => kinds.iter().find(|(n, _)| n == v.1.as_str()).map(|k| k.1),
            Expr::Index(x, ..) => match &x.lhs {
                Expr::Variable(v, ..)
                    if kinds
                        .iter()
                        .any(|(n, k)| *k == Arg::Pods && n == v.1.as_str()) =>
                {
                    Some(Arg::Pod)
                }
                _ => None,
            },
            _ => None,
        }
    };
    let mut bad = None;
    body.walk(&mut |nodes: &[ASTNode]| {
        if let Some(ASTNode::Expr(Expr::Dot(x, _, pos))) = nodes.last()
            && let Some(kind) = kind_of(&x.lhs)
        {
            let prop = match &x.rhs {
                Expr::Property(p, _) => Some(p.2.clone()),
                Expr::Dot(y, ..) | Expr::Index(y, ..) => match &y.lhs {
                    Expr::Property(p, _) => Some(p.2.clone()),
                    _ => None,
                },
                _ => None,
            };
            let known: &[&str] = match kind {
                Arg::Req => &REQ_PROPERTIES,
                Arg::Pod => &POD_PROPERTIES,
                Arg::Pods => &[],
            };
            if let Some(prop) = prop
                && kind != Arg::Pods
                && !known.contains(&prop.as_str())
            {
                bad = Some((prop.to_string(), kind, pos.line()));
                return false;
            }
        }
        true
    });
    let Some((prop, kind, line)) = bad else {
        return Ok(());
    };
    let (what, known): (&str, &[&str]) = match kind {
        Arg::Req => ("a request", &REQ_PROPERTIES),
        _ => ("a pod", &POD_PROPERTIES),
    };
    let hint = crate::error::suggest(&prop, known.iter().copied())
        .map(|s| format!(" (did you mean `{s}`?)"))
        .unwrap_or_default();
    Err(Error::new(format!(
        "script {path}{}: hook `{}` reads `.{prop}`, which {what} does not have{hint}; docs/policies.md lists the properties",
        line.map(|l| format!(", line {l}")).unwrap_or_default(),
        hook.name()
    )))
}
