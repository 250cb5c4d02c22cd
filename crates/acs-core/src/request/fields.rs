//! Typed access to a request body's fields, each error naming its parameter, and the
//! body's canonical JSON.

use serde_json::{Map, Value};

use crate::error::{ApiError, ErrorCode};

/// Parses a body into a JSON object, with `invalid_json` for anything else.
pub fn parse_json_object(body: &[u8]) -> Result<Value, ApiError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidJson,
            format!("The body is not valid UTF-8 (at byte {}).", e.valid_up_to()),
        )
    })?;
    let value: Value = serde_json::from_str(text).map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidJson,
            format!("The body is not valid JSON: {e}."),
        )
    })?;
    if !value.is_object() {
        return Err(ApiError::new(
            ErrorCode::InvalidJson,
            "The body must be a JSON object.",
        ));
    }
    Ok(value)
}

/// The JSON text of `value` with object keys sorted at every depth, so that two
/// bodies that mean the same compare equal (used by idempotency).
pub fn canonical_json(value: &Value) -> String {
    // Sorting here makes the result independent of serde_json's `preserve_order`.
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(&m[k], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

pub(super) fn missing(param: &str, message: &str) -> ApiError {
    ApiError::param(ErrorCode::MissingParameter, param, message)
}

pub(super) fn wrong_type(param: &str, expected: &str) -> ApiError {
    ApiError::param(
        ErrorCode::InvalidType,
        param,
        format!("{param} must be {expected}."),
    )
}

pub(super) fn reject_unknown(
    obj: &Map<String, Value>,
    known: &[&str],
    prefix: &str,
) -> Result<(), ApiError> {
    if let Some(k) = obj.keys().find(|k| !known.contains(&k.as_str())) {
        let param = format!("{prefix}{k}");
        return Err(ApiError::param(
            ErrorCode::UnknownParameter,
            param.clone(),
            format!("Unrecognized request argument supplied: {param}"),
        ));
    }
    Ok(())
}

/// Typed access to an object's fields, with `param` set to `prefix + name`.
/// `null` counts as absent, as in the OpenAI API.
pub(super) struct Fields<'a> {
    pub(super) obj: &'a Map<String, Value>,
    pub(super) prefix: &'a str,
}

impl Fields<'_> {
    pub(super) fn get(&self, name: &str) -> Option<&Value> {
        self.obj.get(name).filter(|v| !v.is_null())
    }

    pub(super) fn param(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    pub(super) fn string(&self, name: &str) -> Result<Option<String>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(wrong_type(&self.param(name), "a string")),
        }
    }

    pub(super) fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(wrong_type(&self.param(name), "a boolean")),
        }
    }

    pub(super) fn int_in(&self, name: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let param = self.param(name);
        let int = as_integer(v).ok_or_else(|| wrong_type(&param, "an integer"))?;
        match int {
            Some(i) if (lo..=hi).contains(&i) => Ok(Some(i)),
            _ => Err(ApiError::invalid_value(
                param.clone(),
                format!("{param} must be an integer from {lo} to {hi}; got {v}."),
            )),
        }
    }

    pub(super) fn number_in(&self, name: &str, lo: f32, hi: f32) -> Result<Option<f32>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let param = self.param(name);
        let x = v.as_f64().ok_or_else(|| wrong_type(&param, "a number"))?;
        if !x.is_finite() || x < f64::from(lo) || x > f64::from(hi) {
            return Err(ApiError::invalid_value(
                param.clone(),
                format!("{param} must be a number from {lo} to {hi}; got {v}."),
            ));
        }
        Ok(Some(x as f32))
    }

    pub(super) fn seed(&self, name: &str) -> Result<Option<u64>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let param = self.param(name);
        match v {
            Value::Number(num) => {
                if let Some(u) = num.as_u64() {
                    Ok(Some(u))
                } else if let Some(i) = num.as_i64() {
                    // Negative seeds are valid in the OpenAI API; keep their bits.
                    Ok(Some(i as u64))
                } else if num.as_f64().is_some_and(|f| f.fract() == 0.0) {
                    Err(ApiError::invalid_value(
                        param.clone(),
                        format!("{param} must fit in 64 bits; got {v}."),
                    ))
                } else {
                    Err(wrong_type(&param, "an integer"))
                }
            }
            _ => Err(wrong_type(&param, "an integer")),
        }
    }
}

/// `Some(Some(i))` for an integer in i64, `Some(None)` for an integral number out of
/// range (a range error, not a type error), `None` for anything else.
pub(super) fn as_integer(v: &Value) -> Option<Option<i64>> {
    let Value::Number(num) = v else {
        return None;
    };
    if let Some(i) = num.as_i64() {
        return Some(Some(i));
    }
    if num.as_u64().is_some() {
        return Some(None);
    }
    match num.as_f64() {
        Some(f) if f.fract() == 0.0 && f.is_finite() => {
            if f.abs() < 9.0e15 {
                Some(Some(f as i64))
            } else {
                Some(None)
            }
        }
        _ => None,
    }
}
