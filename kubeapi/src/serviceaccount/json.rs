//! JSON as the token's and the keys' parsers read it: an object at the top, and no object, at
//! any depth, that names a member twice. serde_json keeps the last of two equal names;
//! go-jose (kube-apiserver's JOSE library) refuses the document. Two parsers that read one
//! token differently are how a token tells a verifier one thing and a reviewer another, so
//! such a document is refused here too.

use std::fmt;

use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Number, Value};

/// Why a document was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum JsonError {
    #[error("not JSON, or not an object")]
    NotAnObject,
    /// An object, at any depth, names a member twice (names compared after unescaping).
    #[error("an object names a member twice")]
    DuplicateMember,
    #[error("an object of the wrong shape")]
    Shape,
}

/// `json` as a `T`: a JSON object (serde would also fill a struct from an array) in which no
/// object repeats a member name.
pub(crate) fn object<T: DeserializeOwned>(json: &[u8]) -> Result<T, JsonError> {
    let strict: Strict = serde_json::from_slice(json).map_err(|_| JsonError::NotAnObject)?;
    if strict.repeated {
        return Err(JsonError::DuplicateMember);
    }
    let Value::Object(object) = strict.value else {
        return Err(JsonError::NotAnObject);
    };
    T::deserialize(Value::Object(object)).map_err(|_| JsonError::Shape)
}

/// A JSON value, and whether any object in it named a member twice (the value then holds the
/// first; it is never used).
struct Strict {
    value: Value,
    repeated: bool,
}

impl Strict {
    fn plain(value: Value) -> Strict {
        Strict {
            value,
            repeated: false,
        }
    }
}

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(from: D) -> Result<Strict, D::Error> {
        from.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Strict;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Strict, E> {
        Ok(Strict::plain(Value::Bool(v)))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Strict, E> {
        Ok(Strict::plain(Value::Number(v.into())))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Strict, E> {
        Ok(Strict::plain(Value::Number(v.into())))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Strict, E> {
        // JSON text has no NaN or infinity; serde_json reads an overflowing literal as one.
        Number::from_f64(v)
            .map(|n| Strict::plain(Value::Number(n)))
            .ok_or_else(|| E::custom("a number out of range"))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Strict, E> {
        Ok(Strict::plain(Value::String(v.to_owned())))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Strict, E> {
        Ok(Strict::plain(Value::String(v)))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Strict, E> {
        Ok(Strict::plain(Value::Null))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Strict, A::Error> {
        let mut items = Vec::new();
        let mut repeated = false;
        while let Some(item) = seq.next_element::<Strict>()? {
            repeated |= item.repeated;
            items.push(item.value);
        }
        Ok(Strict {
            value: Value::Array(items),
            repeated,
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Strict, A::Error> {
        let mut members = Map::new();
        let mut repeated = false;
        while let Some(name) = map.next_key::<String>()? {
            let member = map.next_value::<Strict>()?;
            repeated |= member.repeated;
            if members.contains_key(&name) {
                repeated = true;
            } else {
                members.insert(name, member.value);
            }
        }
        Ok(Strict {
            value: Value::Object(members),
            repeated,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_named_twice_at_any_depth_refuses_the_document() {
        for json in [
            r#"{"alg":"ES256","alg":"none"}"#,
            r#"{"a":1,"b":{"c":1,"c":2}}"#,
            r#"{"a":[{"k":1},{"k":1,"k":1}]}"#,
            // The same name once escaped: equal after unescaping.
            r#"{"exp":1,"\u0065xp":2}"#,
        ] {
            assert_eq!(
                object::<Value>(json.as_bytes()),
                Err(JsonError::DuplicateMember),
                "{json}"
            );
        }
        // Equal names in different objects, and names equal but for case, are not repeats.
        for json in [
            r#"{"a":{"k":1},"b":{"k":1},"c":[{"k":1},{"k":2}]}"#,
            r#"{"exp":1,"EXP":2,"Exp":3}"#,
        ] {
            assert!(object::<Value>(json.as_bytes()).is_ok(), "{json}");
        }
    }

    #[test]
    fn values_read_as_serde_json_reads_them() {
        let json = r#"{"n":-1,"u":18446744073709551615,"f":1.5,"s":"x\"y","b":true,
            "z":null,"a":[1,[2],{"k":"v"}],"o":{}}"#;
        let strict: Value = object(json.as_bytes()).unwrap();
        let plain: Value = serde_json::from_str(json).unwrap();
        assert_eq!(strict, plain);
        for bad in ["", "[]", "1", "\"s\"", "{", "{} {}", "{\"a\":1e999}"] {
            assert_eq!(
                object::<Value>(bad.as_bytes()),
                Err(JsonError::NotAnObject),
                "{bad}"
            );
        }
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Shaped {
            n: u8,
        }
        assert_eq!(
            object::<Shaped>(br#"{"n":"x"}"#).unwrap_err(),
            JsonError::Shape
        );
    }
}
