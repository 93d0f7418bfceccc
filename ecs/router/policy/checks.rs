//! What is checked of a script at load (parameters it reads, assignments to
//! `params`, whether it keeps `state`), and how rhai's errors are turned into
//! the script's error (its line, in nested calls too).

use rhai::{AST, EvalAltResult, Map};

use crate::error::{Error, Result};
use crate::router::policy::MAX_OPERATIONS;

/// The line an error happened at, looking inside nested function calls.
pub(crate) fn error_line(err: &EvalAltResult) -> Option<usize> {
    match err {
        EvalAltResult::ErrorInFunctionCall(_, _, inner, pos) => error_line(inner).or(pos.line()),
        other => other.position().line(),
    }
}

pub(crate) fn describe(err: &EvalAltResult) -> String {
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
pub(crate) fn mentions_variable(ast: &AST, name: &str) -> bool {
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
