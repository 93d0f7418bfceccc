//! Hooks evaluated directly by the host, without the interpreter (an exact
//! shortcut). The script stays the policy: its hook body, as rhai compiled
//! and optimised it (`params` folded in), is translated at load into a small
//! tree this module walks; a hook written with anything outside the subset
//! below runs in rhai as before.
//!
//! The subset: `let`, `=` to a variable, `if`/`else` (as statement or
//! value), `return`, blocks, `for x in pods` and `for x in` an array the
//! hook made; numbers, bools, strings, `[]`; `req.x`, `pod.x`, `a[i]`;
//! `+ - * / %`, comparisons, `&&`, `||`, `!`, unary `-`, `min`, `max`;
//! `x.to_float()`, `x.len()`, `x.is_empty()`, `a.push(v)` on an array the
//! hook made; `argmax(scores, "first")`. Nothing in it has a side
//! effect, so whenever an evaluation meets a case it does not mirror bit for
//! bit — an integer overflow or a division by zero (rhai's errors), a value
//! of a type an operator does not take, a limit rhai could reach — it gives
//! up and the call runs in rhai, which answers or fails as it always did.
//! Where it answers, it answers what rhai does: integer arithmetic checked,
//! an integer meeting a float becomes a float, `min` and `max` compare
//! plainly, and the comparison operators involving a float use rhai's
//! relative tolerance (its checked build's rule). Debug
//! builds (the `checked` test profile) run rhai too on every call and
//! compare.
//!
//! Variables are resolved when the hook is translated: rhai's scope is a
//! stack searched from its top, and within this subset (no `eval`, no
//! closures, no imports) which declaration a name finds depends only on
//! where it is written.

use rhai::{AST, ASTFlags, Expr, ImmutableString, Stmt};

use crate::router::policy::Hook;
use crate::router::policy::plugin::Inputs;
use crate::router::policy::views::{PodView, ReqView};

/// A value during an evaluation. Arrays live in the evaluation's arena and
/// are named by their place there; a pod is named by its position among
/// the hook's `pods` argument.
///
/// The tag is a whole word (`repr(u64)`): with a byte tag, rustc copied a
/// value as bytes 1..16 in pieces of 8, 4, 2 and 1, and reading its number
/// (bytes 8..16) back across two of those stores stalled the load each
/// time; a decision took about 1.5 times as long (`cargo bench --bench
/// routing`).
#[derive(Clone, Copy, Debug)]
#[repr(u64)]
enum V {
    Unit,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// A string the hook writes (its place in [`Direct::strings`]), or one
    /// it does not (a pod's role no constant names).
    Str(u32),
    OtherStr,
    Req,
    Pod(u32),
    /// The `pods` argument.
    Pods,
    /// A picker's `scores` argument.
    Scores,
    Arr(u32),
}

// Two words, and a result of one as well (in the tag's spare values).
const _: () = assert!(std::mem::size_of::<V>() == 16);
const _: () = assert!(std::mem::size_of::<R<V>>() == 16);

impl V {
    /// A number's value as a float (an int converted as rhai converts it).
    fn number(self) -> Option<f64> {
        match self {
            V::Int(i) => Some(i as f64),
            V::Float(x) => Some(x),
            _ => None,
        }
    }
}

/// Why an evaluation gave up: rhai takes the call over.
struct GiveUp;

type R<T> = Result<T, GiveUp>;

#[derive(Clone, Copy, Debug)]
enum Op {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

enum E {
    Const(V),
    Local(u16),
    Prop(Box<E>, Option<fn(&ReqView) -> V>, Option<PodField>),
    /// `x.p` of a variable (the commonest read: no recursion).
    LocalProp(u16, Option<fn(&ReqView) -> V>, Option<PodField>),
    Bin(Op, Box<E>, Box<E>),
    Neg(Box<E>),
    Not(Box<E>),
    /// `&&` (false) or `||` (true) over its operands, in order: the
    /// value that stops the evaluation.
    Logic(bool, Vec<E>),
    ToFloat(Box<E>),
    Len(Box<E>),
    IsEmpty(Box<E>),
    NewArray,
    Push(u16, Box<E>),
    Argmax(Box<E>),
    /// `min(a, b)` (false) or `max(a, b)` (true).
    MinMax(bool, Box<E>, Box<E>),
    Index(Box<E>, Box<E>),
    Block(Vec<S>),
}

enum S {
    Let(u16, E),
    Assign(u16, E),
    Expr(E),
    If(E, Vec<S>, Vec<S>),
    For(u16, E, Vec<S>),
    Return(E),
}

/// A statement list's outcome: its value, or a `return`'s.
enum Flow {
    Value(V),
    Return(V),
}

/// The slots and arrays of one evaluation, kept between calls so an
/// evaluation allocates nothing once they have grown.
#[derive(Default)]
struct Frame {
    slots: Vec<V>,
    arrays: Vec<Vec<V>>,
    used: usize,
}

/// A hook translated for direct evaluation.
pub(crate) struct Direct {
    body: Vec<S>,
    /// The string constants of the body.
    strings: Vec<ImmutableString>,
    slots: usize,
    /// Nodes an evaluation may visit before it gives up: rhai counts an
    /// operation for about every node it evaluates, and fails past its
    /// limit; a quarter of the limit leaves rhai a wide margin.
    budget: u64,
    max_array: usize,
    frame: std::cell::RefCell<Frame>,
}

/// What a hook answered, read before the frame is reused.
pub(crate) enum Answer {
    Bool(bool),
    Number(f64),
    Int(i64),
    /// `score_all`: the numbers are in the caller's vector.
    Numbers,
    /// `filter`: the kept positions (in `pods`, sorted) are in the caller's
    /// vector.
    Kept,
}

struct Translator {
    strings: Vec<ImmutableString>,
    scope: Vec<(ImmutableString, u16)>,
    slots: u16,
}

impl Direct {
    /// The hook's body translated, if all of it is in the subset. `args`
    /// are the hook's parameter names.
    pub(crate) fn translate(
        body: &AST,
        hook: Hook,
        args: &[ImmutableString],
        max_operations: u64,
        max_array: usize,
    ) -> Option<Direct> {
        let expected = match hook {
            Hook::Decide | Hook::Score | Hook::ScoreAll | Hook::Filter => 2,
            Hook::Pick => 3,
        };
        if args.len() != expected {
            return None;
        }
        let mut t = Translator {
            strings: Vec::new(),
            scope: Vec::new(),
            slots: 0,
        };
        for name in args {
            t.declare(name);
        }
        let body = t.block(body.statements())?;
        Some(Direct {
            body,
            strings: t.strings,
            slots: t.slots as usize,
            budget: match max_operations {
                0 => u64::MAX,
                limit => limit / 4,
            },
            max_array,
            frame: Default::default(),
        })
    }

    /// The hook's answer on `inputs`, or None where rhai must answer.
    /// `numbers` and `kept` receive a `score_all`'s and a `filter`'s.
    pub(crate) fn answer(
        &self,
        hook: Hook,
        req: &ReqView,
        inputs: &Inputs,
        numbers: &mut Vec<f64>,
        kept: &mut Vec<usize>,
    ) -> Option<Answer> {
        let mut frame = self.frame.borrow_mut();
        let frame = &mut *frame;
        frame.used = 0;
        frame.slots.clear();
        frame.slots.resize(self.slots, V::Unit);
        frame.slots[0] = V::Req;
        frame.slots[1] = match hook {
            Hook::Decide | Hook::Score => V::Pod(0),
            _ => V::Pods,
        };
        if hook == Hook::Pick {
            frame.slots[2] = V::Scores;
        }
        let mut ev = Eval {
            strings: &self.strings,
            req,
            inputs,
            frame,
            max_array: self.max_array,
            budget: self.budget,
        };
        let top = match ev.block(&self.body).ok()? {
            Flow::Value(v) | Flow::Return(v) => v,
        };
        match (hook, top) {
            (Hook::Decide, V::Bool(b)) => Some(Answer::Bool(b)),
            (Hook::Score, v @ (V::Int(_) | V::Float(_))) => v.number().map(Answer::Number),
            (Hook::Pick, V::Int(i)) => Some(Answer::Int(i)),
            (Hook::ScoreAll, V::Arr(a)) => {
                numbers.clear();
                for v in &ev.frame.arrays[a as usize] {
                    numbers.push(v.number()?);
                }
                Some(Answer::Numbers)
            }
            (Hook::Filter, V::Pods) => {
                kept.clear();
                kept.extend_from_slice(inputs.candidates);
                Some(Answer::Kept)
            }
            (Hook::Filter, V::Arr(a)) => {
                kept.clear();
                for v in &ev.frame.arrays[a as usize] {
                    let V::Pod(k) = *v else { return None };
                    let pos = inputs.candidates[k as usize];
                    // Twice the same pod: rhai's path words the error.
                    if kept.contains(&pos) {
                        return None;
                    }
                    kept.push(pos);
                }
                if kept.is_empty() {
                    return None;
                }
                kept.sort_unstable();
                Some(Answer::Kept)
            }
            _ => None,
        }
    }
}

impl Translator {
    fn declare(&mut self, name: &ImmutableString) -> u16 {
        let slot = self.slots;
        self.slots += 1;
        self.scope.push((name.clone(), slot));
        slot
    }

    fn intern(&mut self, s: &ImmutableString) -> u32 {
        match self.strings.iter().position(|x| x == s) {
            Some(i) => i as u32,
            None => {
                self.strings.push(s.clone());
                self.strings.len() as u32 - 1
            }
        }
    }

    fn find(&self, name: &str) -> Option<u16> {
        self.scope
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|&(_, s)| s)
    }

    /// A block: what it declares is gone after it.
    fn block(&mut self, stmts: &[Stmt]) -> Option<Vec<S>> {
        let mark = self.scope.len();
        let out = stmts.iter().map(|s| self.stmt(s)).collect();
        self.scope.truncate(mark);
        out
    }

    fn stmt(&mut self, s: &Stmt) -> Option<S> {
        Some(match s {
            Stmt::Noop(_) => S::Expr(E::Const(V::Unit)),
            Stmt::Var(x, _, _) => {
                // The value first: `let x = x + 1` reads the older `x`.
                let value = self.expr(&x.1)?;
                S::Let(self.declare(&x.0.name), value)
            }
            Stmt::Assignment(x) => {
                if x.0.is_op_assignment() {
                    return None;
                }
                let Expr::Variable(v, ..) = &x.1.lhs else {
                    return None;
                };
                if !v.2.is_empty() {
                    return None;
                }
                let slot = self.find(&v.1)?;
                S::Assign(slot, self.expr(&x.1.rhs)?)
            }
            Stmt::FnCall(f, _) => S::Expr(self.call(f)?),
            Stmt::Expr(e) => S::Expr(self.expr(e)?),
            Stmt::Block(b) => S::Expr(E::Block(self.block(b.statements())?)),
            Stmt::If(x, _) => S::If(
                self.expr(&x.expr)?,
                self.block(x.body.statements())?,
                self.block(x.branch.statements())?,
            ),
            Stmt::For(x, _) => {
                if x.1.is_some() || !x.2.branch.is_empty() {
                    return None;
                }
                let over = self.expr(&x.2.expr)?;
                let mark = self.scope.len();
                let slot = self.declare(&x.0.name);
                let body = self.block(x.2.body.statements());
                self.scope.truncate(mark);
                S::For(slot, over, body?)
            }
            Stmt::Return(e, flags, _) if flags.is_empty() => S::Return(match e {
                Some(e) => self.expr(e)?,
                None => E::Const(V::Unit),
            }),
            _ => return None,
        })
    }

    fn expr(&mut self, e: &Expr) -> Option<E> {
        let boxed = |t: &mut Self, e: &Expr| t.expr(e).map(Box::new);
        Some(match e {
            Expr::BoolConstant(b, _) => E::Const(V::Bool(*b)),
            Expr::IntegerConstant(i, _) => E::Const(V::Int(*i)),
            Expr::FloatConstant(f, _) => E::Const(V::Float(**f)),
            Expr::StringConstant(s, _) => E::Const(V::Str(self.intern(s))),
            Expr::Unit(_) => E::Const(V::Unit),
            Expr::DynamicConstant(d, _) => E::Const(if let Ok(i) = d.as_int() {
                V::Int(i)
            } else if let Ok(x) = d.as_float() {
                V::Float(x)
            } else if let Ok(b) = d.as_bool() {
                V::Bool(b)
            } else if d.is_array() && d.as_array_ref().is_ok_and(|a| a.is_empty()) {
                // `[]`, which rhai keeps as a constant (each use a new array).
                return Some(E::NewArray);
            } else {
                return None;
            }),
            Expr::Variable(v, ..) if v.2.is_empty() => E::Local(self.find(&v.1)?),
            Expr::Array(items, _) if items.is_empty() => E::NewArray,
            Expr::Stmt(b) => E::Block(self.block(b.statements())?),
            Expr::And(xs, _) | Expr::Or(xs, _) => E::Logic(
                matches!(e, Expr::Or(..)),
                xs.iter().map(|x| self.expr(x)).collect::<Option<_>>()?,
            ),
            Expr::FnCall(f, _) => self.call(f)?,
            // `a[i]`, which ends its chain (`BREAK`); `a[i].x` is an index
            // whose right side is the chain `i.x`, left to rhai.
            Expr::Index(x, flags, _) if *flags == ASTFlags::BREAK => {
                E::Index(boxed(self, &x.lhs)?, boxed(self, &x.rhs)?)
            }
            Expr::Dot(x, flags, _) if flags.is_empty() => match &x.rhs {
                // `a.push(v)`: on a variable, as the whole chain.
                Expr::MethodCall(f, _) if f.name == "push" => {
                    let Expr::Variable(v, ..) = &x.lhs else {
                        return None;
                    };
                    if !v.2.is_empty() || f.args.len() != 1 || !f.namespace.is_empty() {
                        return None;
                    }
                    let slot = self.find(&v.1)?;
                    E::Push(slot, boxed(self, &f.args[0])?)
                }
                // `x.a.f()`: rhai nests the chain to the right.
                chain => {
                    let mut on = self.expr(&x.lhs)?;
                    let mut link = chain;
                    loop {
                        let (this, next) = match link {
                            Expr::Dot(y, flags, _) if flags.is_empty() => (&y.lhs, Some(&y.rhs)),
                            other => (other, None),
                        };
                        on = self.link(on, this)?;
                        match next {
                            Some(n) => link = n,
                            None => break on,
                        }
                    }
                }
            },
            _ => return None,
        })
    }

    /// One link of a chain applied to `on`: a property or a method
    /// without arguments.
    fn link(&mut self, on: E, link: &Expr) -> Option<E> {
        let on = Box::new(on);
        Some(match link {
            Expr::Property(p, _) => {
                let name = p.2.as_str();
                let (r, q) = (req_prop(name), pod_prop(name));
                if r.is_none() && q.is_none() {
                    return None;
                }
                match *on {
                    E::Local(slot) => E::LocalProp(slot, r, q),
                    _ => E::Prop(on, r, q),
                }
            }
            Expr::MethodCall(f, _) if f.namespace.is_empty() && f.args.is_empty() => {
                match f.name.as_str() {
                    "to_float" => E::ToFloat(on),
                    "len" => E::Len(on),
                    "is_empty" => E::IsEmpty(on),
                    _ => return None,
                }
            }
            _ => return None,
        })
    }

    fn call(&mut self, f: &rhai::FnCallExpr) -> Option<E> {
        if !f.namespace.is_empty() || f.capture_parent_scope {
            return None;
        }
        let op = match f.name.as_str() {
            "+" => Some(Op::Add),
            "-" => Some(Op::Sub),
            "*" => Some(Op::Mul),
            "/" => Some(Op::Div),
            "%" => Some(Op::Rem),
            "==" => Some(Op::Eq),
            "!=" => Some(Op::Ne),
            "<" => Some(Op::Lt),
            "<=" => Some(Op::Le),
            ">" => Some(Op::Gt),
            ">=" => Some(Op::Ge),
            _ => None,
        };
        let args = &f.args;
        Some(match (f.name.as_str(), args.len()) {
            (_, 2) if op.is_some() && f.op_token.is_some() => E::Bin(
                op?,
                Box::new(self.expr(&args[0])?),
                Box::new(self.expr(&args[1])?),
            ),
            ("-", 1) => E::Neg(Box::new(self.expr(&args[0])?)),
            ("!", 1) => E::Not(Box::new(self.expr(&args[0])?)),
            ("to_float", 1) => E::ToFloat(Box::new(self.expr(&args[0])?)),
            (name @ ("min" | "max"), 2) => E::MinMax(
                name == "max",
                Box::new(self.expr(&args[0])?),
                Box::new(self.expr(&args[1])?),
            ),
            ("argmax", 2) if matches!(&args[1], Expr::StringConstant(s, _) if s == "first") => {
                E::Argmax(Box::new(self.expr(&args[0])?))
            }
            _ => return None,
        })
    }
}

fn req_prop(name: &str) -> Option<fn(&ReqView) -> V> {
    Some(match name {
        "id" => |r| V::Int(r.id),
        "session" => |r| V::Int(r.session),
        "turn" => |r| V::Int(r.turn),
        "prompt_tokens" => |r| V::Int(r.prompt_tokens),
        "new_tokens" => |r| V::Int(r.new_tokens),
        "block_size" => |r| V::Int(r.block_size),
        "arrival_time" => |r| V::Float(r.arrival_time),
        "now" => |r| V::Float(r.now),
        _ => return None,
    })
}

/// A pod property: a number, or the role (a string).
#[derive(Clone, Copy)]
enum PodField {
    Number(fn(&PodView) -> V),
    Role,
}

fn pod_prop(name: &str) -> Option<PodField> {
    Some(PodField::Number(match name {
        "role" => return Some(PodField::Role),
        "index" => |p| V::Int(p.index),
        "active" => |p| V::Int(p.active),
        "running" => |p| V::Int(p.running),
        "queued" => |p| V::Int(p.queued),
        "parked" => |p| V::Int(p.parked),
        "prompt_backlog" => |p| V::Int(p.prompt_backlog),
        "kv_capacity" => |p| V::Int(p.kv_capacity),
        "kv_held" => |p| V::Int(p.kv_held),
        "kv_free_cached" => |p| V::Int(p.kv_free_cached),
        "cached_tokens" => |p| V::Int(p.cached_tokens),
        "max_num_seqs" => |p| V::Int(p.max_num_seqs),
        "nic_flows" => |p| V::Int(p.nic_flows),
        "nic_capacity" => |p| V::Float(p.nic_capacity),
        "nic_rate" => |p| V::Float(p.nic_rate),
        "router_requests" => |p| V::Int(p.router_requests),
        "router_tokens" => |p| V::Int(p.router_tokens),
        "router_cached_tokens" => |p| V::Int(p.router_cached_tokens),
        _ => return None,
    }))
}

/// rhai's comparison of two numbers of which one at least is a float (its
/// checked build): equal within a relative `f64::EPSILON`, and ordered
/// only beyond it.
fn compare_floats(op: Op, x: f64, y: f64) -> bool {
    let max = if x * y == 0.0 {
        1.0
    } else {
        x.abs().max(y.abs())
    };
    if max == 0.0 {
        return matches!(op, Op::Eq | Op::Ge | Op::Le);
    }
    let eps = f64::EPSILON;
    match op {
        Op::Eq => (x - y).abs() / max <= eps,
        Op::Ne => (x - y).abs() / max > eps,
        Op::Gt => (x - y) / max > eps,
        Op::Ge => (x - y) / max > -eps,
        Op::Lt => (y - x) / max > eps,
        Op::Le => (y - x) / max > -eps,
        _ => unreachable!("not a comparison"),
    }
}

fn float_arith(op: Op, x: f64, y: f64) -> V {
    match op {
        Op::Add => V::Float(x + y),
        Op::Sub => V::Float(x - y),
        Op::Mul => V::Float(x * y),
        Op::Div => V::Float(x / y),
        Op::Rem => V::Float(x % y),
        _ => V::Bool(compare_floats(op, x, y)),
    }
}

fn binary(op: Op, a: V, b: V) -> R<V> {
    Ok(match (a, b) {
        (V::Int(x), V::Int(y)) => match op {
            // rhai's checked arithmetic fails on overflow and on a zero
            // divisor: it words that error.
            Op::Add => V::Int(x.checked_add(y).ok_or(GiveUp)?),
            Op::Sub => V::Int(x.checked_sub(y).ok_or(GiveUp)?),
            Op::Mul => V::Int(x.checked_mul(y).ok_or(GiveUp)?),
            Op::Div => V::Int(x.checked_div(y).ok_or(GiveUp)?),
            Op::Rem => V::Int(x.checked_rem(y).ok_or(GiveUp)?),
            Op::Eq => V::Bool(x == y),
            Op::Ne => V::Bool(x != y),
            Op::Lt => V::Bool(x < y),
            Op::Le => V::Bool(x <= y),
            Op::Gt => V::Bool(x > y),
            Op::Ge => V::Bool(x >= y),
        },
        (V::Float(x), V::Float(y)) => float_arith(op, x, y),
        (V::Float(x), V::Int(y)) => float_arith(op, x, y as f64),
        (V::Int(x), V::Float(y)) => float_arith(op, x as f64, y),
        (V::Bool(x), V::Bool(y)) => match op {
            Op::Eq => V::Bool(x == y),
            Op::Ne => V::Bool(x != y),
            _ => return Err(GiveUp),
        },
        // Interned: equal strings have one place. A string no constant
        // names differs from every constant (two such strings give up).
        (V::Str(x), V::Str(y)) => match op {
            Op::Eq => V::Bool(x == y),
            Op::Ne => V::Bool(x != y),
            _ => return Err(GiveUp),
        },
        (V::Str(_), V::OtherStr) | (V::OtherStr, V::Str(_)) => match op {
            Op::Eq => V::Bool(false),
            Op::Ne => V::Bool(true),
            _ => return Err(GiveUp),
        },
        _ => return Err(GiveUp),
    })
}

struct Eval<'a> {
    strings: &'a [ImmutableString],
    req: &'a ReqView,
    inputs: &'a Inputs<'a>,
    frame: &'a mut Frame,
    max_array: usize,
    /// Nodes it may still visit.
    budget: u64,
}

impl Eval<'_> {
    fn block(&mut self, body: &[S]) -> R<Flow> {
        let mut last = V::Unit;
        for s in body {
            self.visit()?;
            last = match s {
                S::Let(slot, e) => {
                    let v = self.expr(e)?;
                    // A second name for an array would share it here, not
                    // in rhai (which copies).
                    if matches!(v, V::Arr(_)) && !matches!(e, E::NewArray) {
                        return Err(GiveUp);
                    }
                    self.frame.slots[*slot as usize] = v;
                    V::Unit
                }
                S::Assign(slot, e) => {
                    let v = self.expr(e)?;
                    if matches!(v, V::Arr(_)) {
                        return Err(GiveUp);
                    }
                    self.frame.slots[*slot as usize] = v;
                    V::Unit
                }
                S::Expr(e) => self.expr(e)?,
                S::If(c, then, other) => {
                    let V::Bool(b) = self.expr(c)? else {
                        return Err(GiveUp);
                    };
                    match self.block(if b { then } else { other })? {
                        Flow::Value(v) => v,
                        ret => return Ok(ret),
                    }
                }
                S::For(slot, over, body) => {
                    // rhai iterates over a copy of an array: the items it
                    // had when the loop began (pushes only append, and
                    // nothing in the subset changes an item).
                    let (array, n) = match self.expr(over)? {
                        V::Pods => (None, self.inputs.candidates.len()),
                        V::Arr(a) => (Some(a as usize), self.frame.arrays[a as usize].len()),
                        _ => return Err(GiveUp),
                    };
                    for k in 0..n {
                        self.frame.slots[*slot as usize] = match array {
                            None => V::Pod(k as u32),
                            Some(a) => self.frame.arrays[a][k],
                        };
                        if let ret @ Flow::Return(_) = self.block(body)? {
                            return Ok(ret);
                        }
                    }
                    V::Unit
                }
                S::Return(e) => return Ok(Flow::Return(self.expr(e)?)),
            };
        }
        Ok(Flow::Value(last))
    }

    fn pod(&self, k: u32) -> &PodView {
        &self.inputs.pods[self.inputs.candidates[k as usize]]
    }

    fn visit(&mut self) -> R<()> {
        self.budget = self.budget.checked_sub(1).ok_or(GiveUp)?;
        Ok(())
    }

    /// A property of `of`.
    #[inline(always)]
    fn prop(&self, of: V, r: &Option<fn(&ReqView) -> V>, p: &Option<PodField>) -> R<V> {
        Ok(match (of, r, p) {
            (V::Req, Some(f), _) => f(self.req),
            (V::Pod(k), _, Some(PodField::Number(f))) => f(self.pod(k)),
            (V::Pod(k), _, Some(PodField::Role)) => {
                let role = &self.pod(k).role;
                match self.strings.iter().position(|s| s == role) {
                    Some(i) => V::Str(i as u32),
                    None => V::OtherStr,
                }
            }
            _ => return Err(GiveUp),
        })
    }

    /// An expression's value: the leaves here, inline; the rest in `node`.
    #[inline(always)]
    fn expr(&mut self, e: &E) -> R<V> {
        self.visit()?;
        match e {
            E::Const(v) => Ok(*v),
            E::Local(slot) => Ok(self.frame.slots[*slot as usize]),
            E::LocalProp(slot, r, p) => self.prop(self.frame.slots[*slot as usize], r, p),
            _ => self.node(e),
        }
    }

    fn node(&mut self, e: &E) -> R<V> {
        Ok(match e {
            E::Const(_) | E::Local(_) | E::LocalProp(..) => unreachable!("a leaf"),
            E::Prop(of, r, p) => {
                let of = self.expr(of)?;
                self.prop(of, r, p)?
            }
            E::Bin(op, a, b) => {
                let a = self.expr(a)?;
                let b = self.expr(b)?;
                binary(*op, a, b)?
            }
            E::Neg(a) => match self.expr(a)? {
                V::Int(i) => V::Int(i.checked_neg().ok_or(GiveUp)?),
                V::Float(x) => V::Float(-x),
                _ => return Err(GiveUp),
            },
            E::Not(a) => match self.expr(a)? {
                V::Bool(b) => V::Bool(!b),
                _ => return Err(GiveUp),
            },
            E::Logic(stop, xs) => {
                for x in xs {
                    match self.expr(x)? {
                        V::Bool(b) if b == *stop => return Ok(V::Bool(b)),
                        V::Bool(_) => {}
                        _ => return Err(GiveUp),
                    }
                }
                V::Bool(!stop)
            }
            E::ToFloat(a) => match self.expr(a)? {
                V::Int(i) => V::Float(i as f64),
                x @ V::Float(_) => x,
                _ => return Err(GiveUp),
            },
            E::Len(a) => V::Int(self.len(a)? as i64),
            E::IsEmpty(a) => V::Bool(self.len(a)? == 0),
            E::NewArray => {
                let f = &mut *self.frame;
                if f.used == f.arrays.len() {
                    f.arrays.push(Vec::new());
                }
                f.arrays[f.used].clear();
                f.used += 1;
                V::Arr(f.used as u32 - 1)
            }
            E::Push(slot, item) => {
                let item = self.expr(item)?;
                if matches!(item, V::Arr(_)) {
                    return Err(GiveUp);
                }
                let V::Arr(a) = self.frame.slots[*slot as usize] else {
                    return Err(GiveUp);
                };
                let arr = &mut self.frame.arrays[a as usize];
                if self.max_array > 0 && arr.len() + 1 >= self.max_array {
                    return Err(GiveUp);
                }
                arr.push(item);
                V::Unit
            }
            E::Argmax(a) => {
                let of = self.expr(a)?;
                V::Int(self.argmax_first(of)?)
            }
            // rhai's min and max: plain comparisons (no tolerance), an int
            // meeting a float as a float.
            E::MinMax(max, a, b) => {
                let (a, b) = (self.expr(a)?, self.expr(b)?);
                let pick = |first: bool| if first == *max { a } else { b };
                match (a, b) {
                    (V::Int(x), V::Int(y)) => pick(if *max { x >= y } else { x <= y }),
                    _ => {
                        let (x, y) = (a.number().ok_or(GiveUp)?, b.number().ok_or(GiveUp)?);
                        let first = if *max { x >= y } else { x <= y };
                        V::Float(if first { x } else { y })
                    }
                }
            }
            // An index in range (rhai counts a negative one from the end,
            // and fails out of range).
            E::Index(a, i) => {
                let (of, i) = (self.expr(a)?, self.expr(i)?);
                let V::Int(i) = i else { return Err(GiveUp) };
                let i = usize::try_from(i).map_err(|_| GiveUp)?;
                match of {
                    V::Pods if i < self.inputs.candidates.len() => V::Pod(i as u32),
                    V::Scores if i < self.inputs.scores.len() => V::Float(self.inputs.scores[i]),
                    V::Arr(a) => *self.frame.arrays[a as usize].get(i).ok_or(GiveUp)?,
                    _ => return Err(GiveUp),
                }
            }
            // A `return` inside an expression: rhai's to follow.
            E::Block(body) => match self.block(body)? {
                Flow::Value(v) => v,
                Flow::Return(_) => return Err(GiveUp),
            },
        })
    }

    fn len(&mut self, a: &E) -> R<usize> {
        Ok(match self.expr(a)? {
            V::Pods => self.inputs.candidates.len(),
            V::Scores => self.inputs.scores.len(),
            V::Arr(a) => self.frame.arrays[a as usize].len(),
            _ => return Err(GiveUp),
        })
    }

    /// The sandbox's `argmax(xs, "first")`: the first of the largest.
    fn argmax_first(&self, of: V) -> R<i64> {
        let first = |xs: &mut dyn Iterator<Item = Option<f64>>| -> R<i64> {
            let mut best = f64::NEG_INFINITY;
            let mut at = None;
            for (i, x) in xs.enumerate() {
                let x = x.filter(|x| !x.is_nan()).ok_or(GiveUp)?;
                // (Strictly larger: ties stay with the first.)
                if at.is_none() || x > best {
                    best = x;
                    at = Some(i as i64);
                }
            }
            at.ok_or(GiveUp)
        };
        match of {
            V::Scores => first(&mut self.inputs.scores.iter().map(|&x| Some(x))),
            V::Arr(a) => first(&mut self.frame.arrays[a as usize].iter().map(|v| v.number())),
            _ => Err(GiveUp),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::policy::{Plugin, sandbox};
    use crate::scenario::{ParamValue, ScriptLimits};
    use rand::{RngExt, SeedableRng};
    use rhai::Dynamic;
    use std::collections::BTreeMap;

    fn engine(limits: &ScriptLimits) -> rhai::Engine {
        sandbox::new_engine(1, Some(std::path::Path::new("lib")), limits).unwrap()
    }

    /// `script` loaded as the `hook` plugin (with `params`).
    fn load(
        engine: &rhai::Engine,
        hook: Hook,
        script: &str,
        params: &[(&str, ParamValue)],
    ) -> Plugin {
        let params: BTreeMap<String, ParamValue> = params
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        Plugin::from_text(engine, "test.rhai", script, hook, &params, 1.0)
            .unwrap_or_else(|e| panic!("{script}: {e}"))
    }

    fn catalogue(name: &str) -> String {
        std::fs::read_to_string(format!("scripts/{name}.rhai")).unwrap()
    }

    type Params = Vec<(&'static str, ParamValue)>;

    fn str_param(v: &str) -> ParamValue {
        ParamValue::Str(v.into())
    }

    fn random_pod(rng: &mut impl rand::Rng, index: i64) -> PodView {
        // Small ranges, so that ties, zeros and equal values are common.
        PodView {
            role: ["decode", "prefill", "other"][rng.random_range(0..3)].into(),
            index,
            active: rng.random_range(0..4),
            running: rng.random_range(0..4),
            queued: rng.random_range(0..3),
            parked: rng.random_range(0..2),
            prompt_backlog: rng.random_range(0..3) * 1000,
            kv_capacity: 160_000,
            kv_held: rng.random_range(0..160_000),
            kv_free_cached: rng.random_range(0..1000),
            cached_tokens: rng.random_range(0..3) * 512,
            max_num_seqs: 64,
            nic_flows: rng.random_range(0..3),
            nic_capacity: 200_000.0,
            nic_rate: rng.random_range(0..3) as f64 * 66_666.6,
            router_requests: rng.random_range(0..4),
            router_tokens: rng.random_range(0..3) * 700,
            router_cached_tokens: rng.random_range(0..3) * 256,
        }
    }

    /// Calls `plugin` on random inputs both ways: where the host answers,
    /// rhai must answer the same. Returns how many calls the host answered.
    fn differential(engine: &rhai::Engine, plugin: &Plugin, calls: u32, seed: u64) -> u32 {
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
        let mut answered = 0;
        for id in 0..calls {
            let prompt = rng.random_range(1..3000);
            let req = ReqView {
                id: id as i64,
                session: rng.random_range(0..5),
                turn: rng.random_range(0..4),
                prompt_tokens: prompt,
                new_tokens: rng.random_range(0..=prompt),
                block_size: 16,
                arrival_time: rng.random_range(0..1000) as f64 * 0.1,
                now: rng.random_range(0..1000) as f64 * 0.1,
            };
            let n = rng.random_range(1..5);
            let pods: Vec<PodView> = (0..n).map(|i| random_pod(&mut rng, i as i64)).collect();
            let candidates: Vec<usize> = match plugin.hook {
                Hook::Decide | Hook::Score => vec![rng.random_range(0..n)],
                _ => (0..n).filter(|_| rng.random_range(0..4) > 0).collect(),
            };
            if candidates.is_empty() {
                continue;
            }
            let scores: Vec<f64> = candidates
                .iter()
                .map(|_| rng.random_range(0..4) as f64 * 0.25)
                .collect();
            let inputs = Inputs {
                pods: &pods,
                candidates: &candidates,
                scores: if plugin.hook == Hook::Pick {
                    &scores
                } else {
                    &[]
                },
            };
            let (mut numbers, mut kept) = (Vec::new(), Vec::new());
            let none = None::<fn() -> (Dynamic, Dynamic)>;
            let Some(answer) =
                plugin.answer_directly(engine, &inputs, &req, &mut numbers, &mut kept, none)
            else {
                continue;
            };
            answered += 1;
            let r = Dynamic::from(req.clone());
            let array = || -> rhai::Array {
                candidates
                    .iter()
                    .map(|&i| Dynamic::from(pods[i].clone()))
                    .collect()
            };
            let agrees = match plugin.hook {
                Hook::Decide | Hook::Score => {
                    let pod = Dynamic::from(pods[candidates[0]].clone());
                    plugin.rhai_agrees(engine, &answer, &inputs, &numbers, &kept, (r, pod), &req)
                }
                Hook::Pick => {
                    let s: rhai::Array = scores.iter().map(|&x| Dynamic::from_float(x)).collect();
                    let args = (r, array(), s);
                    plugin.rhai_agrees(engine, &answer, &inputs, &numbers, &kept, args, &req)
                }
                _ => plugin.rhai_agrees(
                    engine,
                    &answer,
                    &inputs,
                    &numbers,
                    &kept,
                    (r, array()),
                    &req,
                ),
            };
            assert!(
                agrees.unwrap_or_else(|e| panic!("{}: rhai failed: {e}", plugin.path)),
                "{}: call {id}: the host and rhai disagree on {req:?} {pods:?} {candidates:?}",
                plugin.path
            );
        }
        answered
    }

    #[test]
    fn every_property_a_script_may_read_is_the_hosts_too() {
        use crate::router::policy::views::{POD_PROPERTIES, REQ_PROPERTIES};
        for p in REQ_PROPERTIES {
            assert!(req_prop(p).is_some(), "request property {p}");
        }
        for p in POD_PROPERTIES {
            assert!(pod_prop(p).is_some(), "pod property {p}");
        }
    }

    #[test]
    fn the_catalogues_pure_hooks_are_evaluated_by_the_host_as_rhai_does() {
        let e = engine(&ScriptLimits::default());
        let sources = [str_param("pods"), str_param("router")];
        let mut cases: Vec<(&str, Hook, Params)> = Vec::new();
        for source in &sources {
            let s = || ("source", source.clone());
            cases.push(("active-request-scorer", Hook::Score, vec![s()]));
            cases.push((
                "active-request-scorer",
                Hook::Score,
                vec![s(), ("idle_threshold", ParamValue::Int(1))],
            ));
            cases.push(("prefix-based-pd-decider", Hook::Decide, vec![s()]));
            cases.push((
                "prefix-based-pd-decider",
                Hook::Decide,
                vec![s(), ("non_cached_tokens", ParamValue::Int(0))],
            ));
            cases.push((
                "prefix-cache-affinity-filter",
                Hook::Filter,
                vec![s(), ("min_match_ratio", ParamValue::Float(0.0))],
            ));
            cases.push(("prefix-cache-affinity-filter", Hook::Filter, vec![s()]));
            cases.push(("token-load-scorer", Hook::Score, vec![s()]));
        }
        cases.push((
            "max-score-picker",
            Hook::Pick,
            vec![("ties", str_param("first"))],
        ));
        cases.push(("queue-scorer", Hook::Score, vec![]));
        cases.push(("kv-cache-utilization-scorer", Hook::Score, vec![]));
        cases.push(("load-aware-scorer", Hook::Score, vec![]));
        cases.push(("always-disagg-pd-decider", Hook::Decide, vec![]));
        cases.push(("never-disagg-pd-decider", Hook::Decide, vec![]));
        for (seed, (name, hook, params)) in cases.iter().enumerate() {
            let p = load(&e, *hook, &catalogue(name), params);
            assert!(p.evaluates_directly(), "{name} {params:?}");
            let answered = differential(&e, &p, 2000, seed as u64);
            assert!(
                answered > 1500,
                "{name} {params:?}: the host answered {answered} of 2000"
            );
        }
        // Random or stateful: rhai's.
        for (name, hook, params) in [
            (
                "max-score-picker",
                Hook::Pick,
                vec![("ties", str_param("random"))],
            ),
            ("random-picker", Hook::Pick, vec![]),
            ("round-robin-picker", Hook::Pick, vec![]),
            // (A function of lib/pd.rhai.)
            ("prefix-cache-scorer", Hook::Score, vec![]),
        ] {
            assert!(
                !load(&e, hook, &catalogue(name), &params).evaluates_directly(),
                "{name}"
            );
        }
    }

    /// A hook of signature `signature` with `body`.
    fn hook(signature: &str, body: &str) -> String {
        format!("fn {signature} {{ {body} }}")
    }

    #[test]
    fn hooks_in_the_subset_agree_with_rhai_on_random_inputs() {
        let e = engine(&ScriptLimits::default());
        let bodies: [(Hook, &str, &str); 12] = [
            // rhai compares a float within a relative epsilon: 0.1 + 0.2 == 0.3.
            (
                Hook::Decide,
                "decide(req, pod)",
                "0.1 * req.turn + 0.2 * req.turn == 0.3 * req.turn",
            ),
            (
                Hook::Decide,
                "decide(req, pod)",
                "pod.nic_rate >= 66666.6 || !(pod.role == \"decode\")",
            ),
            (
                Hook::Decide,
                "decide(req, pod)",
                "let x = req.turn; let x = x + 1; { let x = 5; } x > 2 && pod.role != \"prefill\"",
            ),
            (
                Hook::Score,
                "score(req, pod)",
                "if pod.active == 0 { return 1; } -pod.active.to_float() / 4 + pod.queued % 2",
            ),
            (
                Hook::Score,
                "score(req, pod)",
                "let l = pod.kv_held; if l > 80000 { l / 1000 } else { l.to_float() / 1000.0 }",
            ),
            (
                Hook::Score,
                "score(req, pod)",
                "req.arrival_time - req.now + req.new_tokens / 7",
            ),
            (
                Hook::ScoreAll,
                "score_all(req, pods)",
                "let s = []; for p in pods { s.push(p.running * 2 - p.queued); } s",
            ),
            (
                Hook::ScoreAll,
                "score_all(req, pods)",
                "let s = []; for p in pods { if p.role == \"other\" { return []; } s.push(if p.active > pods.len() { 0.5 } else { 1 }); } s",
            ),
            (
                Hook::Filter,
                "filter(req, pods)",
                "let k = []; for p in pods { if p.cached_tokens >= 512 { k.push(p); } } if k.is_empty() { pods } else { k }",
            ),
            (
                Hook::Filter,
                "filter(req, pods)",
                "let k = []; for p in pods { for q in pods { if q.index == p.index && p.router_tokens < 1400 { k.push(q); } } } if k.len() == 0 { pods } else { k }",
            ),
            (
                Hook::Pick,
                "pick(req, pods, scores)",
                "argmax(scores, \"first\")",
            ),
            (
                Hook::Pick,
                "pick(req, pods, scores)",
                "let s = []; for p in pods { s.push(p.active); } argmax(s, \"first\")",
            ),
        ];
        for (seed, (h, sig, body)) in bodies.iter().enumerate() {
            let p = load(&e, *h, &hook(sig, body), &[]);
            assert!(p.evaluates_directly(), "{body}");
            let answered = differential(&e, &p, 1500, 100 + seed as u64);
            assert!(
                answered > 1000,
                "{body}: the host answered {answered} of 1500"
            );
        }
    }

    #[test]
    fn what_the_subset_leaves_out_runs_in_rhai() {
        let e = engine(&ScriptLimits::default());
        for (h, sig, body) in [
            (Hook::Score, "score(req, pod)", "state.n = 1; 1.0"),
            (Hook::Score, "score(req, pod)", "let x = 1; x += 1; x"),
            (Hook::Score, "score(req, pod)", "random()"),
            (Hook::Score, "score(req, pod)", "pd::active_requests(pod)"),
            (
                Hook::ScoreAll,
                "score_all(req, pods)",
                "pods.map(|p| p.active)",
            ),
            (
                Hook::ScoreAll,
                "score_all(req, pods)",
                "let s = []; for i in 0..pods.len() { s.push(pods[i].active); } s",
            ),
            (
                Hook::Score,
                "score(req, pod)",
                "let i = 0; while i < 3 { i = i + 1; } i",
            ),
            (Hook::ScoreAll, "score_all(req, pods)", "[pods[0].active]"),
        ] {
            assert!(
                !load(&e, h, &hook(sig, body), &[]).evaluates_directly(),
                "{body}"
            );
        }
        // A script that redefines a function of the subset is rhai's.
        let script = format!(
            "fn to_float(x) {{ 7.0 }}\n{}",
            hook("score(req, pod)", "pod.active.to_float()")
        );
        assert!(!load(&e, Hook::Score, &script, &[]).evaluates_directly());
    }

    /// The host's answer, or None where it gives up.
    fn direct(p: &Plugin, req: &ReqView, pods: &[PodView], candidates: &[usize]) -> Option<String> {
        let inputs = Inputs {
            pods,
            candidates,
            scores: &[],
        };
        let (mut numbers, mut kept) = (Vec::new(), Vec::new());
        let none = None::<fn() -> (Dynamic, Dynamic)>;
        p.answer_directly(
            &engine(&ScriptLimits::default()),
            &inputs,
            req,
            &mut numbers,
            &mut kept,
            none,
        )
        .map(|a| match a {
            Answer::Bool(b) => format!("{b}"),
            Answer::Number(x) => format!("{x}"),
            Answer::Int(i) => format!("{i}"),
            Answer::Numbers => format!("{numbers:?}"),
            Answer::Kept => format!("{kept:?}"),
        })
    }

    #[test]
    fn hand_worked_answers_and_the_cases_left_to_rhai() {
        let e = engine(&ScriptLimits::default());
        let req = ReqView {
            prompt_tokens: 2500,
            turn: 2,
            ..Default::default()
        };
        let pods: Vec<PodView> = (0..3)
            .map(|i| PodView {
                index: i,
                active: 3 - i,
                cached_tokens: 512 * i,
                role: "decode".into(),
                ..Default::default()
            })
            .collect();
        let score = |body: &str| load(&e, Hook::Score, &hook("score(req, pod)", body), &[]);
        let on = |p: &Plugin, k: usize| direct(p, &req, &pods, &[k]);
        // 2500 − 1024 = 1476; an int meeting a float becomes a float.
        assert_eq!(
            on(&score("req.prompt_tokens - pod.cached_tokens"), 2),
            Some("1476".into())
        );
        assert_eq!(
            on(&score("req.prompt_tokens / 1000 + 0.5"), 0),
            Some("2.5".into())
        );
        // 2^53 + 1 as a float is 2^53: not greater (rhai compares as floats).
        let p = load(
            &e,
            Hook::Decide,
            &hook("decide(req, pod)", "9007199254740993 > 9007199254740992.0"),
            &[],
        );
        assert_eq!(on(&p, 0), Some("false".into()));
        // Within rhai's relative epsilon: equal.
        let p = load(
            &e,
            Hook::Decide,
            &hook("decide(req, pod)", "0.1 + 0.2 == 0.3"),
            &[],
        );
        assert_eq!(on(&p, 0), Some("true".into()));
        // Overflow and a zero divisor are rhai's errors: the host gives up,
        // and rhai's call fails with its own message.
        for body in [
            "req.prompt_tokens * 9223372036854775807",
            "1 / (req.turn - 2)",
            "pod.active % 0",
        ] {
            let p = score(body);
            assert_eq!(on(&p, 0), None, "{body}");
            let args = (Dynamic::from(req.clone()), Dynamic::from(pods[0].clone()));
            assert!(p.call(&e, args, &req).is_err(), "{body}");
        }
        // A second name for an array would alias it: rhai's.
        let p = load(
            &e,
            Hook::ScoreAll,
            &hook(
                "score_all(req, pods)",
                "let a = []; let b = a; b.push(1); a",
            ),
            &[],
        );
        assert_eq!(direct(&p, &req, &pods, &[0]), None);
        // A filter: the pods with a cached block (positions 1 and 2 of 0..3);
        // keeping one twice is rhai's error to word.
        let f = |body: &str| load(&e, Hook::Filter, &hook("filter(req, pods)", body), &[]);
        let keep = f("let k = []; for p in pods { if p.cached_tokens > 0 { k.push(p); } } k");
        assert_eq!(
            direct(&keep, &req, &pods, &[0, 1, 2]),
            Some("[1, 2]".into())
        );
        assert_eq!(direct(&keep, &req, &pods, &[0, 2]), Some("[2]".into()));
        let twice = f("let k = []; for p in pods { k.push(p); k.push(p); } k");
        assert_eq!(direct(&twice, &req, &pods, &[0, 1]), None);
        // (max − c) / max over active 3, 2, 1: 0, 1/3, 2/3.
        let sc = load(&e, Hook::Score, &catalogue("active-request-scorer"), &[]);
        assert_eq!(
            direct(&sc, &req, &pods, &[0, 1, 2]),
            Some(format!("{:?}", [0.0, 1.0 / 3.0, 2.0 / 3.0]))
        );
    }

    #[test]
    fn under_a_small_operation_limit_rhai_runs_and_fails_as_before() {
        let limits = ScriptLimits {
            operations: 20,
            ..Default::default()
        };
        let e = engine(&limits);
        let p = load(&e, Hook::Score, &catalogue("active-request-scorer"), &[]);
        let req = ReqView::default();
        let pods: Vec<PodView> = (0..8)
            .map(|i| PodView {
                index: i,
                active: i,
                ..Default::default()
            })
            .collect();
        let all: Vec<usize> = (0..8).collect();
        let inputs = Inputs {
            pods: &pods,
            candidates: &all,
            scores: &[],
        };
        let (mut numbers, mut kept) = (Vec::new(), Vec::new());
        let none = None::<fn() -> (Dynamic, Dynamic)>;
        assert!(
            p.answer_directly(&e, &inputs, &req, &mut numbers, &mut kept, none)
                .is_none()
        );
        let arr: rhai::Array = pods.iter().map(|p| Dynamic::from(p.clone())).collect();
        let err = p
            .call(&e, (Dynamic::from(req.clone()), arr), &req)
            .unwrap_err();
        assert!(err.to_string().contains("operations"), "{err}");
    }
}
