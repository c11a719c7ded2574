//! One JSON text read without building it: strict where asked (a key given twice, a number out
//! of range), and its values counted against a bound, before anything decodes it into a tree
//! (decoded, a value costs some hundred bytes whatever its size in the text).

use std::collections::HashSet;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// Whether `text` is one JSON value of at most `max_values` values (numbers, strings, arrays,
/// objects…), and with `strict`, no key given twice and no number out of range.
pub fn check(text: &str, max_values: usize, strict: bool) -> Result<(), String> {
    let mut de = serde_json::Deserializer::from_str(text);
    let values = std::cell::Cell::new(0usize);
    Reading {
        count: &values,
        max: max_values,
        strict,
    }
    .deserialize(&mut de)
    .map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())
}

/// A reading of one JSON value that counts the values it holds.
#[derive(Clone, Copy)]
struct Reading<'a> {
    count: &'a std::cell::Cell<usize>,
    max: usize,
    strict: bool,
}

impl Reading<'_> {
    fn count<E: de::Error>(self) -> Result<(), E> {
        let n = self.count.get() + 1;
        self.count.set(n);
        if n > self.max {
            return Err(E::custom(format!(
                "the request holds more than {} JSON values",
                self.max
            )));
        }
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Reading<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Reading<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.count()
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.count()
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.count()
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        if v.is_finite() || !self.strict {
            self.count()
        } else {
            Err(E::custom("a number out of range"))
        }
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.count()
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.count()
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.count()?;
        while seq.next_element_seed(self)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.count()?;
        let mut keys = HashSet::new();
        while let Some(k) = map.next_key::<String>()? {
            if self.strict && !keys.insert(k.clone()) {
                return Err(de::Error::custom(format!("the key {k:?} is given twice")));
            }
            map.next_value_seed(self)?;
        }
        Ok(())
    }
}
