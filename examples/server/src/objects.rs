//! JSON read as the OpenAPI document describes it: every struct from an
//! object, at any depth.
//!
//! serde reads a struct from a JSON array too, taking its fields by
//! position, so `[1]` would be a cancel body and `{"items": [["t", 1]]}` a
//! batch of submissions. [`from_value`] reads a value the same way as
//! `serde_json::from_value`, except that an array where a struct is
//! expected is an error, however deep it is; [`from_slice`] reads JSON
//! text so, and refuses an object that names a field twice.

use std::fmt;

use serde::Deserialize;
use serde::de::{
    DeserializeOwned, DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Unexpected,
    Visitor,
};
use serde_json::{Error, Map, Value};

/// `value` as a `T`, every struct in it read from an object.
pub(crate) fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, Error> {
    T::deserialize(Objects(value))
}

/// JSON text as a `T`, every struct in it read from an object; an object
/// with a repeated name is refused, at any depth.
pub(crate) fn from_slice<T: DeserializeOwned>(text: &[u8]) -> Result<T, Error> {
    from_value(value_from_slice(text)?)
}

/// JSON text as a value, refusing an object with a repeated name at any
/// depth.
pub(crate) fn value_from_slice(text: &[u8]) -> Result<Value, Error> {
    serde_json::from_slice(text).map(|Once(value)| value)
}

/// A JSON value whose objects name each field once.
struct Once(Value);

impl<'de> Deserialize<'de> for Once {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(OnceVisitor).map(Once)
    }
}

struct OnceVisitor;

impl<'de> Visitor<'de> for OnceVisitor {
    type Value = Value;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Value, A::Error> {
        let mut values = Vec::with_capacity(items.size_hint().unwrap_or(0).min(64));
        while let Some(Once(item)) = items.next_element()? {
            values.push(item);
        }
        Ok(Value::Array(values))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut fields: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(name) = fields.next_key::<String>()? {
            let Once(value) = fields.next_value()?;
            if object.contains_key(&name) {
                return Err(A::Error::custom(format_args!("duplicate field `{name}`")));
            }
            object.insert(name, value);
        }
        Ok(Value::Object(object))
    }
}

/// A JSON value whose structs are objects only.
struct Objects(Value);

/// Everything but structs, options, newtypes and enums reads as the
/// value is.
macro_rules! as_it_is {
    ($($method:ident)*) => {
        $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
            self.deserialize_any(visitor)
        })*
    };
}

impl<'de> Deserializer<'de> for Objects {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Array(items) => visitor.visit_seq(Items(items.into_iter())),
            Value::Object(fields) => visitor.visit_map(Fields {
                fields: fields.into_iter(),
                value: None,
            }),
            scalar => scalar.deserialize_any(visitor),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::Object(_) => self.deserialize_any(visitor),
            Value::Array(_) => Err(Error::invalid_type(Unexpected::Seq, &"a JSON object")),
            other => other.deserialize_struct(name, fields, visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    /// Enums are names (a unit variant) or one-field objects; the latter's
    /// content is read as serde_json reads it.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.0.deserialize_enum(name, variants, visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    as_it_is! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64
        deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char deserialize_str
        deserialize_string deserialize_bytes deserialize_byte_buf deserialize_unit
        deserialize_seq deserialize_map deserialize_identifier
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_any(visitor)
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_any(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_any(visitor)
    }
}

/// An array's items, each read as [`Objects`].
struct Items(std::vec::IntoIter<Value>);

impl<'de> SeqAccess<'de> for Items {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.0
            .next()
            .map(|item| seed.deserialize(Objects(item)))
            .transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

/// An object's fields, each value read as [`Objects`].
struct Fields {
    fields: <Map<String, Value> as IntoIterator>::IntoIter,
    value: Option<Value>,
}

impl<'de> MapAccess<'de> for Fields {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        match self.fields.next() {
            Some((name, value)) => {
                self.value = Some(value);
                seed.deserialize(Value::String(name)).map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, Error> {
        let value = self
            .value
            .take()
            .ok_or_else(|| Error::custom("a value asked for before its key"))?;
        seed.deserialize(Objects(value))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.fields.len())
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::from_value;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Item {
        task: String,
        token: u64,
        #[serde(default)]
        note: Option<String>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Batch {
        items: Vec<Item>,
        brief: Value,
        #[serde(default)]
        pair: Option<(u8, u8)>,
        #[serde(default)]
        state: Option<State>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "snake_case")]
    enum State {
        Ready,
    }

    use serde_json::Value;

    #[test]
    fn objects_read_as_serde_json_reads_them() {
        let value = json!({
            "items": [{ "task": "t", "token": 1 }, { "task": "u", "token": 2, "note": null }],
            "brief": [1, { "a": [true] }, null],
            "pair": [1, 2],
            "state": "ready",
        });
        let expected: Batch = serde_json::from_value(value.clone()).unwrap();
        assert_eq!(from_value::<Batch>(value).unwrap(), expected);
        assert_eq!(expected.items[1].task, "u");
        assert_eq!(expected.brief, json!([1, { "a": [true] }, null]));
    }

    #[test]
    fn a_struct_from_an_array_is_refused_at_any_depth() {
        for value in [
            json!([[{ "task": "t", "token": 1 }], 1]),
            json!({ "items": [["t", 1, null]], "brief": 1 }),
        ] {
            // serde_json alone reads them by position...
            assert!(serde_json::from_value::<Batch>(value.clone()).is_ok());
            // ...and here they are refused.
            let error = from_value::<Batch>(value).unwrap_err().to_string();
            assert!(error.contains("expected a JSON object"), "{error}");
        }
    }

    #[test]
    fn a_field_named_twice_is_refused_at_any_depth() {
        let twice =
            br#"{"items": [{"task": "t", "token": 1, "token": 2}], "brief": {"a": 1, "a": 1}}"#;
        let error = super::from_slice::<Batch>(twice).unwrap_err().to_string();
        assert!(error.contains("duplicate field `token`"), "{error}");
        let inside = br#"{"items": [], "brief": {"a": 1, "a": 2}}"#;
        let error = super::from_slice::<Batch>(inside).unwrap_err().to_string();
        assert!(error.contains("duplicate field `a`"), "{error}");
        let once = br#"{"items": [{"task": "t", "token": 1}], "brief": {"a": [1, 2.5, "x"]}}"#;
        let read = super::from_slice::<Batch>(once).unwrap();
        assert_eq!(read.brief, json!({"a": [1, 2.5, "x"]}));
    }

    #[test]
    fn unknown_fields_and_wrong_types_are_refused_as_before() {
        let unknown = json!({ "items": [{ "task": "t", "token": 1, "x": 0 }], "brief": 1 });
        let error = from_value::<Batch>(unknown).unwrap_err().to_string();
        assert!(error.contains("unknown field `x`"), "{error}");
        let negative = json!({ "items": [{ "task": "t", "token": -1 }], "brief": 1 });
        assert!(from_value::<Batch>(negative).is_err());
        let state = json!({ "items": [], "brief": 1, "state": "gone" });
        assert!(from_value::<Batch>(state).is_err());
    }
}
