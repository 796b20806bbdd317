//! A request's `priority` (vLLM's field: lower values are served first) as the gateway passes
//! it on: raised to the caller key's `priority=N`, so no key can jump ahead of its floor. Pure.

use serde_json::{Map, Value};

/// Set `body`'s `priority` for an engine scheduled by priority (`enabled`) and a key whose
/// floor is `floor`. Returns whether the body changed, or the message of a 400: a `priority`
/// that is not an integer, or one other than 0 while the engine runs first come, first served.
pub fn apply(body: &mut Map<String, Value>, enabled: bool, floor: Option<i64>) -> Result<bool, String> {
    let asked = match body.get("priority") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_i64().ok_or_else(|| format!("priority must be an integer, not {v}"))?),
    };
    if !enabled {
        return match asked {
            Some(p) if p != 0 => Err(format!(
                "priority {p} is not served: this deployment schedules first come, first served; \
                 set engine.scheduling_policy to priority in the kit to use priorities"
            )),
            _ => Ok(false),
        };
    }
    let Some(given) = [asked, floor].into_iter().flatten().max() else { return Ok(false) };
    if asked == Some(given) {
        return Ok(false);
    }
    body.insert("priority".into(), Value::from(given));
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(body: Value, enabled: bool, floor: Option<i64>) -> (Result<bool, String>, Value) {
        let mut m = body.as_object().unwrap().clone();
        let r = apply(&mut m, enabled, floor);
        (r, m.get("priority").cloned().unwrap_or(Value::Null))
    }

    #[test]
    fn raised_to_the_key_floor_never_lowered() {
        assert_eq!(run(json!({"priority": -5}), true, Some(2)), (Ok(true), json!(2)));
        assert_eq!(run(json!({}), true, Some(2)), (Ok(true), json!(2)));
        assert_eq!(run(json!({"priority": 9}), true, Some(2)), (Ok(false), json!(9)));
        assert_eq!(run(json!({"priority": -5}), true, None), (Ok(false), json!(-5)));
        assert_eq!(run(json!({}), true, None), (Ok(false), Value::Null));
    }

    #[test]
    fn fcfs_refuses_a_priority_with_the_fix() {
        let (r, _) = run(json!({"priority": 3}), false, Some(2));
        assert!(r.unwrap_err().contains("set engine.scheduling_policy to priority"));
        assert_eq!(run(json!({"priority": 0}), false, None).0, Ok(false));
        assert!(run(json!({"priority": "high"}), true, None).0.unwrap_err().contains("must be an integer"));
    }
}
