//! Panic-free edits of JSON that came from a client or a provider. Reading with `value["k"]`
//! never panics (serde_json answers `Null` for a missing key or a value of another kind), but
//! writing through it does: `value["k"] = …` panics when `value` is not an object, and
//! `value[0]` when it is not an array of that length (SPEC P4). Every write into untrusted JSON
//! goes through these instead; `tests/lint.rs` keeps it so.

use serde_json::Value;

/// Sets `key` to `new` when `value` is an object; anything else is left as it is. Whether it
/// was set.
pub fn set(value: &mut Value, key: &str, new: impl Into<Value>) -> bool {
    match value.as_object_mut() {
        Some(object) => {
            object.insert(key.to_string(), new.into());
            true
        }
        None => false,
    }
}

/// The member `key` of `value`, when `value` is an object that has it.
pub fn member_mut<'a>(value: &'a mut Value, key: &str) -> Option<&'a mut Value> {
    value.as_object_mut()?.get_mut(key)
}

/// The first element of the array member `key` of `value` (chat's `choices[0]`).
pub fn first_mut<'a>(value: &'a mut Value, key: &str) -> Option<&'a mut Value> {
    member_mut(value, key)?.as_array_mut()?.first_mut()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn writes_into_values_of_another_kind_do_nothing() {
        for mut v in [json!(1), json!("s"), json!([1]), json!(null), json!(true)] {
            let before = v.clone();
            assert!(!set(&mut v, "k", 1));
            assert_eq!(v, before);
            assert!(member_mut(&mut v, "k").is_none());
            assert!(first_mut(&mut v, "k").is_none());
        }
        let mut v = json!({"choices": [], "x": {"y": 1}});
        assert!(first_mut(&mut v, "choices").is_none());
        assert!(set(member_mut(&mut v, "x").unwrap(), "z", 2));
        assert_eq!(v["x"], json!({"y": 1, "z": 2}));
    }
}
