//! Whether a stored `Ok` value reads back as itself: a recording of the serde data model.
//!
//! A plain fn's `Ok` value is stored as JSON, and JSON says less than the serde data
//! model: `Some(None)` and `None` are both `null`, a newtype struct is its field, a unit
//! variant is its name. Comparing the JSON of the value with the JSON of the value read
//! back from it cannot see such a loss (`Some(None)` reads back as `None`, which is
//! `null` again). So the value and the value read back are each serialized into a
//! [`Recording`]: the sequence of serde calls they make (`serialize_some`, `serialize_none`,
//! each primitive with its width and value, struct, variant and field names, variant
//! indices, lengths, the end of each compound). Equal recordings mean that nothing a
//! `Serialize` impl shows of the value was lost; no `PartialEq` on the user's type is
//! needed.
//!
//! The entries of a map are compared as a set (sorted by their recordings): a `HashMap`
//! read back iterates in another order and is the same map. The elements of a sequence
//! keep their order (a `HashSet` read back in another order is another value, so such a
//! result is refused).
//!
//! What a recording cannot see: two values that make the same serde calls. A
//! `#[serde(untagged)]` enum writes no variant at all (`Cents(5)` and `Units(5)` both
//! serialize as the bare `5`), so no comparison through `Serialize` can tell them apart;
//! only the type's own equality can. So a type with `PartialEq` is compared by it as
//! well (see `fns::SameProbe`); for a type without it, tag such an enum (serde's
//! default, or `#[serde(tag = "...")]`) or derive `PartialEq` for its results to replay
//! faithfully.

use serde::Serialize;
use serde::ser::{self, Serializer};

/// Whether `value` and `back` make the same serde calls (maps compared as sets), or
/// why one of them cannot be recorded.
pub(crate) fn same_data<T: Serialize + ?Sized>(value: &T, back: &T) -> Result<bool, String> {
    Ok(record(value)? == record(back)?)
}

/// The serde calls `value` makes.
fn record<T: Serialize + ?Sized>(value: &T) -> Result<Vec<Call>, String> {
    let mut out = Recording::default();
    value.serialize(&mut out).map_err(|e| e.0)?;
    Ok(out.calls)
}

/// One serde call, with what it passes (names, indices, lengths, values). Integers and
/// floats keep their width; floats are compared by their bits (`NaN` equals itself,
/// `-0.0` is not `0.0`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Call {
    Bool(bool),
    Signed(u8, i128),
    Unsigned(u8, u128),
    Float(u8, u64),
    Char(char),
    Str(String),
    Bytes(Vec<u8>),
    None,
    Some,
    Unit,
    UnitStruct(&'static str),
    UnitVariant(&'static str, u32, &'static str),
    NewtypeStruct(&'static str),
    NewtypeVariant(&'static str, u32, &'static str),
    Seq(Option<usize>),
    Tuple(usize),
    TupleStruct(&'static str, usize),
    TupleVariant(&'static str, u32, &'static str, usize),
    Map(Option<usize>),
    Struct(&'static str, usize),
    StructVariant(&'static str, u32, &'static str, usize),
    Field(&'static str),
    SkippedField(&'static str),
    /// The end of a compound.
    End,
}

/// The serde calls of one value, in order; a serializer.
#[derive(Default)]
struct Recording {
    calls: Vec<Call>,
}

/// Why a value could not be recorded (its `Serialize` impl failed).
#[derive(Debug)]
struct RecordError(String);

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RecordError {}

impl ser::Error for RecordError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        RecordError(msg.to_string())
    }
}

impl Recording {
    fn push(&mut self, call: Call) -> Result<(), RecordError> {
        self.calls.push(call);
        Ok(())
    }

    fn nested<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), RecordError> {
        value.serialize(&mut *self)
    }
}

impl<'a> Serializer for &'a mut Recording {
    type Ok = ();
    type Error = RecordError;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = MapRecording<'a>;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    fn serialize_bool(self, v: bool) -> Result<(), RecordError> {
        self.push(Call::Bool(v))
    }
    fn serialize_i8(self, v: i8) -> Result<(), RecordError> {
        self.push(Call::Signed(8, v.into()))
    }
    fn serialize_i16(self, v: i16) -> Result<(), RecordError> {
        self.push(Call::Signed(16, v.into()))
    }
    fn serialize_i32(self, v: i32) -> Result<(), RecordError> {
        self.push(Call::Signed(32, v.into()))
    }
    fn serialize_i64(self, v: i64) -> Result<(), RecordError> {
        self.push(Call::Signed(64, v.into()))
    }
    fn serialize_i128(self, v: i128) -> Result<(), RecordError> {
        self.push(Call::Signed(128, v))
    }
    fn serialize_u8(self, v: u8) -> Result<(), RecordError> {
        self.push(Call::Unsigned(8, v.into()))
    }
    fn serialize_u16(self, v: u16) -> Result<(), RecordError> {
        self.push(Call::Unsigned(16, v.into()))
    }
    fn serialize_u32(self, v: u32) -> Result<(), RecordError> {
        self.push(Call::Unsigned(32, v.into()))
    }
    fn serialize_u64(self, v: u64) -> Result<(), RecordError> {
        self.push(Call::Unsigned(64, v.into()))
    }
    fn serialize_u128(self, v: u128) -> Result<(), RecordError> {
        self.push(Call::Unsigned(128, v))
    }
    fn serialize_f32(self, v: f32) -> Result<(), RecordError> {
        self.push(Call::Float(32, v.to_bits().into()))
    }
    fn serialize_f64(self, v: f64) -> Result<(), RecordError> {
        self.push(Call::Float(64, v.to_bits()))
    }
    fn serialize_char(self, v: char) -> Result<(), RecordError> {
        self.push(Call::Char(v))
    }
    fn serialize_str(self, v: &str) -> Result<(), RecordError> {
        self.push(Call::Str(v.to_owned()))
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), RecordError> {
        self.push(Call::Bytes(v.to_owned()))
    }
    fn serialize_none(self) -> Result<(), RecordError> {
        self.push(Call::None)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), RecordError> {
        self.push(Call::Some)?;
        self.nested(value)
    }
    fn serialize_unit(self) -> Result<(), RecordError> {
        self.push(Call::Unit)
    }
    fn serialize_unit_struct(self, name: &'static str) -> Result<(), RecordError> {
        self.push(Call::UnitStruct(name))
    }
    fn serialize_unit_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
    ) -> Result<(), RecordError> {
        self.push(Call::UnitVariant(name, index, variant))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result<(), RecordError> {
        self.push(Call::NewtypeStruct(name))?;
        self.nested(value)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), RecordError> {
        self.push(Call::NewtypeVariant(name, index, variant))?;
        self.nested(value)
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Self, RecordError> {
        self.push(Call::Seq(len))?;
        Ok(self)
    }
    fn serialize_tuple(self, len: usize) -> Result<Self, RecordError> {
        self.push(Call::Tuple(len))?;
        Ok(self)
    }
    fn serialize_tuple_struct(self, name: &'static str, len: usize) -> Result<Self, RecordError> {
        self.push(Call::TupleStruct(name, len))?;
        Ok(self)
    }
    fn serialize_tuple_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self, RecordError> {
        self.push(Call::TupleVariant(name, index, variant, len))?;
        Ok(self)
    }
    fn serialize_map(self, len: Option<usize>) -> Result<MapRecording<'a>, RecordError> {
        self.push(Call::Map(len))?;
        Ok(MapRecording {
            out: self,
            entries: Vec::new(),
            key: None,
        })
    }
    fn serialize_struct(self, name: &'static str, len: usize) -> Result<Self, RecordError> {
        self.push(Call::Struct(name, len))?;
        Ok(self)
    }
    fn serialize_struct_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self, RecordError> {
        self.push(Call::StructVariant(name, index, variant, len))?;
        Ok(self)
    }
}

/// The elements of a sequence or tuple, in order.
macro_rules! elements {
    ($($trait:ident :: $method:ident),* $(,)?) => {$(
        impl ser::$trait for &mut Recording {
            type Ok = ();
            type Error = RecordError;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), RecordError> {
                self.nested(value)
            }
            fn end(self) -> Result<(), RecordError> {
                self.push(Call::End)
            }
        }
    )*};
}

elements!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field,
);

/// The fields of a struct, each after its name.
macro_rules! fields {
    ($($trait:ident),* $(,)?) => {$(
        impl ser::$trait for &mut Recording {
            type Ok = ();
            type Error = RecordError;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), RecordError> {
                self.push(Call::Field(key))?;
                self.nested(value)
            }
            fn skip_field(&mut self, key: &'static str) -> Result<(), RecordError> {
                self.push(Call::SkippedField(key))
            }
            fn end(self) -> Result<(), RecordError> {
                self.push(Call::End)
            }
        }
    )*};
}

fields!(SerializeStruct, SerializeStructVariant);

/// A map's entries, recorded one by one and written sorted at its end: a map is the
/// same map in any iteration order. (Each entry's recording is self-delimiting, so the
/// sorted entries written one after another say which key goes with which value.)
struct MapRecording<'a> {
    out: &'a mut Recording,
    entries: Vec<(Vec<Call>, Vec<Call>)>,
    key: Option<Vec<Call>>,
}

impl ser::SerializeMap for MapRecording<'_> {
    type Ok = ();
    type Error = RecordError;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), RecordError> {
        let mut r = Recording::default();
        r.nested(key)?;
        self.key = Some(r.calls);
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), RecordError> {
        let key = self
            .key
            .take()
            .ok_or_else(|| RecordError("a map value without its key".into()))?;
        let mut r = Recording::default();
        r.nested(value)?;
        self.entries.push((key, r.calls));
        Ok(())
    }

    fn end(mut self) -> Result<(), RecordError> {
        self.entries.sort();
        for (key, value) in self.entries {
            self.out.calls.extend(key);
            self.out.calls.extend(value);
        }
        self.out.push(Call::End)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recordings_see_what_json_does_not() {
        assert!(!same_data(&Some(None::<u8>), &None).unwrap());
        assert!(same_data(&Some(Some(1u8)), &Some(Some(1u8))).unwrap());
        assert!(same_data(&f64::NAN, &f64::NAN).unwrap());
        assert!(!same_data(&0.0f64, &-0.0f64).unwrap());
        let a: std::collections::HashMap<u32, u32> = (0..50).map(|i| (i, i * 2)).collect();
        let b: std::collections::HashMap<u32, u32> = (0..50).rev().map(|i| (i, i * 2)).collect();
        assert!(same_data(&a, &b).unwrap());
        let c: std::collections::HashMap<u32, u32> = (0..50).map(|i| (i, i)).collect();
        assert!(!same_data(&a, &c).unwrap());
    }
}
