//! Floats in the fingerprint: telling a float binding from the rest (a serializer that
//! accepts only a float), and writing a non-finite float at any depth as its own string
//! (a serializer that wraps `serde_json`'s).

use serde::Serializer;
use serde::ser::{
    SerializeMap, SerializeSeq, SerializeStruct, SerializeStructVariant, SerializeTuple,
    SerializeTupleStruct, SerializeTupleVariant,
};

use super::*;

/// How a non-finite float is written in the fingerprint (`serde_json` writes all three
/// as `null`, which `None` is too): `NaN`, `+inf` or `-inf`; `None` for a finite one.
pub(super) fn non_finite(value: f64) -> Option<&'static str> {
    if value.is_nan() {
        Some("NaN")
    } else if value.is_infinite() {
        Some(if value > 0.0 { "+inf" } else { "-inf" })
    } else {
        None
    }
}

/// A value serialized as it is, except that each non-finite float in it, at any depth
/// (a struct's field, a list's element, a map's value or key, inside `Some`), is the
/// string [`non_finite`] names. Within one type a float's place holds a float, so such
/// a string cannot be a string of the same place.
pub(super) struct Finite<'a, T: ?Sized>(pub(super) &'a T);

impl<T: Serialize + ?Sized> Serialize for Finite<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(FiniteSer(serializer))
    }
}

/// The serializer (or compound) that [`Finite`] wraps: every call forwarded, nested
/// values wrapped again, non-finite floats written as strings.
struct FiniteSer<S>(S);

macro_rules! forward {
    ($($method:ident($($arg:ident: $ty:ty),*)),* $(,)?) => {$(
        fn $method(self, $($arg: $ty),*) -> Result<S::Ok, S::Error> {
            self.0.$method($($arg),*)
        }
    )*};
}

impl<S: Serializer> Serializer for FiniteSer<S> {
    type Ok = S::Ok;
    type Error = S::Error;
    type SerializeSeq = FiniteSer<S::SerializeSeq>;
    type SerializeTuple = FiniteSer<S::SerializeTuple>;
    type SerializeTupleStruct = FiniteSer<S::SerializeTupleStruct>;
    type SerializeTupleVariant = FiniteSer<S::SerializeTupleVariant>;
    type SerializeMap = FiniteSer<S::SerializeMap>;
    type SerializeStruct = FiniteSer<S::SerializeStruct>;
    type SerializeStructVariant = FiniteSer<S::SerializeStructVariant>;

    fn serialize_f64(self, v: f64) -> Result<S::Ok, S::Error> {
        match non_finite(v) {
            Some(text) => self.0.serialize_str(text),
            None => self.0.serialize_f64(v),
        }
    }

    fn serialize_f32(self, v: f32) -> Result<S::Ok, S::Error> {
        match non_finite(f64::from(v)) {
            Some(text) => self.0.serialize_str(text),
            None => self.0.serialize_f32(v),
        }
    }

    forward!(
        serialize_bool(v: bool),
        serialize_i8(v: i8),
        serialize_i16(v: i16),
        serialize_i32(v: i32),
        serialize_i64(v: i64),
        serialize_i128(v: i128),
        serialize_u8(v: u8),
        serialize_u16(v: u16),
        serialize_u32(v: u32),
        serialize_u64(v: u64),
        serialize_u128(v: u128),
        serialize_char(v: char),
        serialize_str(v: &str),
        serialize_bytes(v: &[u8]),
        serialize_none(),
        serialize_unit(),
        serialize_unit_struct(name: &'static str),
        serialize_unit_variant(name: &'static str, index: u32, variant: &'static str),
    );

    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<S::Ok, S::Error> {
        self.0.serialize_some(&Finite(v))
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        v: &T,
    ) -> Result<S::Ok, S::Error> {
        self.0.serialize_newtype_struct(name, &Finite(v))
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        v: &T,
    ) -> Result<S::Ok, S::Error> {
        self.0
            .serialize_newtype_variant(name, index, variant, &Finite(v))
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Self::SerializeSeq, S::Error> {
        self.0.serialize_seq(len).map(FiniteSer)
    }

    fn serialize_tuple(self, len: usize) -> Result<Self::SerializeTuple, S::Error> {
        self.0.serialize_tuple(len).map(FiniteSer)
    }

    fn serialize_tuple_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleStruct, S::Error> {
        self.0.serialize_tuple_struct(name, len).map(FiniteSer)
    }

    fn serialize_tuple_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleVariant, S::Error> {
        self.0
            .serialize_tuple_variant(name, index, variant, len)
            .map(FiniteSer)
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Self::SerializeMap, S::Error> {
        self.0.serialize_map(len).map(FiniteSer)
    }

    fn serialize_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStruct, S::Error> {
        self.0.serialize_struct(name, len).map(FiniteSer)
    }

    fn serialize_struct_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStructVariant, S::Error> {
        self.0
            .serialize_struct_variant(name, index, variant, len)
            .map(FiniteSer)
    }

    fn collect_str<T: std::fmt::Display + ?Sized>(self, v: &T) -> Result<S::Ok, S::Error> {
        self.0.collect_str(v)
    }

    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

/// The elements of a sequence or tuple, each wrapped.
macro_rules! finite_elements {
    ($($trait:ident :: $method:ident),* $(,)?) => {$(
        impl<S: $trait> $trait for FiniteSer<S> {
            type Ok = S::Ok;
            type Error = S::Error;
            fn $method<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), S::Error> {
                self.0.$method(&Finite(v))
            }
            fn end(self) -> Result<S::Ok, S::Error> {
                self.0.end()
            }
        }
    )*};
}

finite_elements!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field,
);

/// The fields of a struct, each wrapped.
macro_rules! finite_fields {
    ($($trait:ident),* $(,)?) => {$(
        impl<S: $trait> $trait for FiniteSer<S> {
            type Ok = S::Ok;
            type Error = S::Error;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                v: &T,
            ) -> Result<(), S::Error> {
                self.0.serialize_field(key, &Finite(v))
            }
            fn skip_field(&mut self, key: &'static str) -> Result<(), S::Error> {
                self.0.skip_field(key)
            }
            fn end(self) -> Result<S::Ok, S::Error> {
                self.0.end()
            }
        }
    )*};
}

finite_fields!(SerializeStruct, SerializeStructVariant);

impl<S: SerializeMap> SerializeMap for FiniteSer<S> {
    type Ok = S::Ok;
    type Error = S::Error;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), S::Error> {
        self.0.serialize_key(&Finite(key))
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), S::Error> {
        self.0.serialize_value(&Finite(v))
    }

    fn serialize_entry<K: Serialize + ?Sized, V: Serialize + ?Sized>(
        &mut self,
        key: &K,
        v: &V,
    ) -> Result<(), S::Error> {
        self.0.serialize_entry(&Finite(key), &Finite(v))
    }

    fn end(self) -> Result<S::Ok, S::Error> {
        self.0.end()
    }
}

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
