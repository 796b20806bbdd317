//! The leaf types of the checkpoint audit: a finding and its severity, and the codebook of a
//! packed matrix with its marker values. Every audit part (`exl3_audit`, `quant_ledger`,
//! `claims`) reports through these; they import nothing from the audit.

use serde::Serialize;

/// MUL1 marker, `0x83DCD12D` little-endian (exl3-format.md §1.4).
pub const MUL1_MARKER: [u8; 4] = 0x83DC_D12D_u32.to_le_bytes();
/// MCG marker, `0xCBAC1FED` little-endian.
pub const MCG_MARKER: [u8; 4] = 0xCBAC_1FED_u32.to_le_bytes();
/// The codebook of a packed matrix, from its marker (absent = 3INST).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Codebook {
    #[serde(rename = "mul1")]
    Mul1,
    #[serde(rename = "mcg")]
    Mcg,
    #[serde(rename = "3inst")]
    ThreeInst,
}

impl Codebook {
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Codebook::Mul1 => "mul1",
            Codebook::Mcg => "mcg",
            Codebook::ThreeInst => "3inst",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// The checkpoint will not load, or will load wrongly.
    Error,
    /// Odd but loadable.
    Warning,
}

/// One problem found, naming the tensor it is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub severity: Severity,
    pub tensor: Option<String>,
    pub message: String,
}
