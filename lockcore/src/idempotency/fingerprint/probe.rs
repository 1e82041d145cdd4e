//! Telling a float binding from the rest: a serializer that accepts only a float.

use super::*;

/// A serializer that accepts a float (an `f32` or `f64` binding, or `Some` of one) and
/// refuses anything else: how [`Fingerprint::add`] tells a float binding from the rest.
pub(super) struct FloatProbe;

/// What [`FloatProbe`] refuses.
#[derive(Debug)]
pub(super) struct NotFloat;

impl std::fmt::Display for NotFloat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not a float")
    }
}

impl std::error::Error for NotFloat {}

impl serde::ser::Error for NotFloat {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        NotFloat
    }
}

macro_rules! refuse {
    ($($method:ident($($arg:ty),*)),* $(,)?) => {$(
        fn $method(self, $(_: $arg),*) -> Result<f64, NotFloat> {
            Err(NotFloat)
        }
    )*};
}

impl serde::Serializer for FloatProbe {
    type Ok = f64;
    type Error = NotFloat;
    type SerializeSeq = serde::ser::Impossible<f64, NotFloat>;
    type SerializeTuple = serde::ser::Impossible<f64, NotFloat>;
    type SerializeTupleStruct = serde::ser::Impossible<f64, NotFloat>;
    type SerializeTupleVariant = serde::ser::Impossible<f64, NotFloat>;
    type SerializeMap = serde::ser::Impossible<f64, NotFloat>;
    type SerializeStruct = serde::ser::Impossible<f64, NotFloat>;
    type SerializeStructVariant = serde::ser::Impossible<f64, NotFloat>;

    fn serialize_f64(self, v: f64) -> Result<f64, NotFloat> {
        Ok(v)
    }

    fn serialize_f32(self, v: f32) -> Result<f64, NotFloat> {
        Ok(f64::from(v))
    }

    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<f64, NotFloat> {
        v.serialize(self)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        v: &T,
    ) -> Result<f64, NotFloat> {
        v.serialize(self)
    }

    refuse!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
        serialize_none(),
        serialize_unit(),
        serialize_unit_struct(&'static str),
        serialize_unit_variant(&'static str, u32, &'static str),
    );

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<f64, NotFloat> {
        Err(NotFloat)
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, NotFloat> {
        Err(NotFloat)
    }

    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, NotFloat> {
        Err(NotFloat)
    }

    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, NotFloat> {
        Err(NotFloat)
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, NotFloat> {
        Err(NotFloat)
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, NotFloat> {
        Err(NotFloat)
    }

    fn serialize_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStruct, NotFloat> {
        Err(NotFloat)
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, NotFloat> {
        Err(NotFloat)
    }
}
