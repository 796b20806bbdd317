//! Launch kits: schema, built-in kits, layering with explained precedence, validation.

pub mod bytes;
pub mod positions;
pub mod schema;
pub mod shape;
