//! The one seam between the store's decisions and a database engine.
//!
//! The store ([`crate::store`]) writes its transitions once, against [`Tx`]: statements take
//! typed arguments ([`Arg`]) and give rows of plain values ([`Value`]). SQLite
//! (`sqlite`) and PostgreSQL (`pg`) each implement it, including the few
//! statements whose dialects differ (the claim above all, see [`Tx::dialect`]).
//!
//! The shared SQL is the common subset of both engines, written with numbered `?N`
//! placeholders; PostgreSQL's side rewrites the placeholders and the handful of SQLite
//! functions it spells differently (see `crate::pg::translate`). Booleans are stored as
//! integers 0/1 on both, so the same comparisons hold.

use crate::error::{Error, Result};

/// Which engine a transaction runs on, for the statements that must differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// A statement argument. Typed even when NULL, because PostgreSQL must know every parameter's
/// type when it prepares the statement.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    Int(Option<i64>),
    Real(Option<f64>),
    Text(Option<String>),
}

impl From<i64> for Arg {
    fn from(v: i64) -> Self {
        Arg::Int(Some(v))
    }
}
impl From<Option<i64>> for Arg {
    fn from(v: Option<i64>) -> Self {
        Arg::Int(v)
    }
}
impl From<u32> for Arg {
    fn from(v: u32) -> Self {
        Arg::Int(Some(v.into()))
    }
}
impl From<bool> for Arg {
    fn from(v: bool) -> Self {
        Arg::Int(Some(v.into()))
    }
}
impl From<f64> for Arg {
    fn from(v: f64) -> Self {
        Arg::Real(Some(v))
    }
}
impl From<Option<f64>> for Arg {
    fn from(v: Option<f64>) -> Self {
        Arg::Real(v)
    }
}
impl From<&str> for Arg {
    fn from(v: &str) -> Self {
        Arg::Text(Some(v.to_owned()))
    }
}
impl From<String> for Arg {
    fn from(v: String) -> Self {
        Arg::Text(Some(v))
    }
}
impl From<&String> for Arg {
    fn from(v: &String) -> Self {
        Arg::Text(Some(v.clone()))
    }
}
impl From<Option<String>> for Arg {
    fn from(v: Option<String>) -> Self {
        Arg::Text(v)
    }
}
impl From<&Option<String>> for Arg {
    fn from(v: &Option<String>) -> Self {
        Arg::Text(v.clone())
    }
}
impl From<Option<&str>> for Arg {
    fn from(v: Option<&str>) -> Self {
        Arg::Text(v.map(str::to_owned))
    }
}

/// `args![a, b]`: a statement's arguments.
macro_rules! args {
    ($($a:expr),* $(,)?) => { &[$($crate::sql::Arg::from($a)),*][..] };
}
pub(crate) use args;

/// One column of a result row.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
}

/// A result row.
#[derive(Debug, Clone)]
pub struct Row(pub Vec<Value>);

impl Row {
    pub fn get<T: FromValue>(&self, i: usize) -> Result<T> {
        let v = self.0.get(i).unwrap_or(&Value::Null);
        T::from_value(v).ok_or_else(|| Error::Decode {
            column: i,
            message: format!("{v:?} is not {}", T::NAME),
        })
    }
}

/// A Rust type a column can be read as.
pub trait FromValue: Sized {
    const NAME: &'static str;
    fn from_value(v: &Value) -> Option<Self>;
}

impl FromValue for i64 {
    const NAME: &'static str = "an integer";
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }
}
impl FromValue for f64 {
    const NAME: &'static str = "a number";
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Real(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }
}
impl FromValue for bool {
    const NAME: &'static str = "a boolean";
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Int(i) => Some(*i != 0),
            _ => None,
        }
    }
}
impl FromValue for String {
    const NAME: &'static str = "text";
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Text(s) => Some(s.clone()),
            _ => None,
        }
    }
}
impl FromValue for u32 {
    const NAME: &'static str = "a process id";
    fn from_value(v: &Value) -> Option<Self> {
        i64::from_value(v).and_then(|i| u32::try_from(i).ok())
    }
}
impl FromValue for usize {
    const NAME: &'static str = "a count";
    fn from_value(v: &Value) -> Option<Self> {
        i64::from_value(v).and_then(|i| usize::try_from(i).ok())
    }
}
impl<T: FromValue> FromValue for Option<T> {
    const NAME: &'static str = T::NAME;
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Null => Some(None),
            v => T::from_value(v).map(Some),
        }
    }
}

/// A transaction (or, for reads, a connection) the store's statements run in.
pub trait Tx {
    fn dialect(&self) -> Dialect;
    /// Runs a statement; returns the number of rows it changed.
    fn exec(&mut self, sql: &str, args: &[Arg]) -> Result<u64>;
    /// Runs a statement that returns rows (a SELECT, or a write with RETURNING).
    fn query(&mut self, sql: &str, args: &[Arg]) -> Result<Vec<Row>>;

    fn query_opt(&mut self, sql: &str, args: &[Arg]) -> Result<Option<Row>> {
        Ok(self.query(sql, args)?.into_iter().next())
    }

    fn query_one(&mut self, sql: &str, args: &[Arg]) -> Result<Row> {
        self.query_opt(sql, args)?.ok_or_else(|| Error::Decode {
            column: 0,
            message: "a statement that always returns a row returned none".into(),
        })
    }
}
