//! The checks of one packed EXL3 matrix: trellis dtype and shape (→ K), `suh`/`svh` (or legacy
//! `su`/`sv`), optional `bias`, and at most one codebook marker whose 4 bytes are read.

use super::finding::{Codebook, Finding, Severity, MCG_MARKER, MUL1_MARKER};
use super::k_map::k_of_last_dim;
use super::safetensors::Dtype;
use super::{CheckpointError, MarkerReader, Origin, Tensor};

/// The parts of one packed matrix, by leaf name.
#[derive(Default)]
pub(super) struct Parts<'a> {
    pub(super) trellis: Option<&'a Tensor>,
    pub(super) suh: Option<&'a Tensor>,
    pub(super) svh: Option<&'a Tensor>,
    pub(super) su: Option<&'a Tensor>,
    pub(super) sv: Option<&'a Tensor>,
    pub(super) mul1: Option<&'a Tensor>,
    pub(super) mcg: Option<&'a Tensor>,
    pub(super) bias: Option<&'a Tensor>,
    pub(super) extra: Vec<&'a Tensor>,
}

fn err(findings: &mut Vec<Finding>, tensor: &str, message: String) {
    findings.push(Finding { severity: Severity::Error, tensor: Some(tensor.to_string()), message });
}

/// Check one packed matrix; returns (K, Kp, Np, codebook) when the trellis itself is valid.
pub(super) fn check_packed(
    prefix: &str,
    parts: &Parts<'_>,
    markers: &mut MarkerReader<'_>,
    markers_checked: bool,
    findings: &mut Vec<Finding>,
) -> Result<Option<(f64, u64, u64, Codebook)>, CheckpointError> {
    let Some(trellis) = parts.trellis else { return Ok(None) };
    let name = &trellis.name;
    if trellis.dtype != Dtype::I16 {
        err(findings, name, format!("`{name}` is {}, expected I16", trellis.dtype));
        return Ok(None);
    }
    let [t0, t1, last] = trellis.shape[..] else {
        err(findings, name, format!("`{name}` has shape {:?}, expected rank 3 [Kp/16, Np/16, 16·K]", trellis.shape));
        return Ok(None);
    };
    let Some(k) = k_of_last_dim(last) else {
        err(
            findings,
            name,
            format!(
                "`{name}` last dim {last} is not 16·K for a valid K (16..128 step 16, or 24/40/56 for K 1.5/2.5/3.5)"
            ),
        );
        return Ok(None);
    };
    if t0 % 8 != 0 || t1 % 8 != 0 || t0 == 0 || t1 == 0 {
        err(
            findings,
            name,
            format!(
                "`{name}` shape {:?}: dims 0 and 1 must be non-zero multiples of 8 (features padded to 128)",
                trellis.shape
            ),
        );
        return Ok(None);
    }
    let (kp, np) = (16 * t0, 16 * t1);

    check_vector(findings, prefix, "suh", parts.suh, parts.su, kp, t0);
    check_vector(findings, prefix, "svh", parts.svh, parts.sv, np, t1);
    if let Some(bias) = parts.bias {
        if bias.dtype != Dtype::F16 || bias.shape != [np] {
            err(
                findings,
                &bias.name,
                format!("`{}` is {} {:?}, expected F16 [{np}]", bias.name, bias.dtype, bias.shape),
            );
        }
    }

    let codebook = match (parts.mul1, parts.mcg) {
        (Some(a), Some(_)) => {
            err(
                findings,
                &a.name,
                format!("`{prefix}` has both `mul1` and `mcg` markers; they are mutually exclusive"),
            );
            Codebook::Mul1
        }
        (Some(m), None) => {
            check_marker(m, MUL1_MARKER, markers, markers_checked, findings)?;
            Codebook::Mul1
        }
        (None, Some(m)) => {
            check_marker(m, MCG_MARKER, markers, markers_checked, findings)?;
            Codebook::Mcg
        }
        (None, None) => Codebook::ThreeInst,
    };
    if last % 16 == 8 && codebook != Codebook::Mul1 {
        err(
            findings,
            name,
            format!(
                "`{name}` has half-integer K = {k}, which needs a `{prefix}.mul1` marker (found {})",
                codebook.name()
            ),
        );
    }
    Ok(Some((k, kp, np, codebook)))
}

/// `suh`/`svh` (F16 `[16·tiles]`) or legacy `su`/`sv` (I16 `[tiles]`).
fn check_vector(
    findings: &mut Vec<Finding>,
    prefix: &str,
    leaf: &str,
    modern: Option<&Tensor>,
    legacy: Option<&Tensor>,
    len: u64,
    tiles: u64,
) {
    match (modern, legacy) {
        (Some(t), _) => {
            if t.dtype != Dtype::F16 || t.shape != [len] {
                err(findings, &t.name, format!("`{}` is {} {:?}, expected F16 [{len}]", t.name, t.dtype, t.shape));
            }
        }
        (None, Some(t)) => {
            if t.dtype != Dtype::I16 || t.shape != [tiles] {
                err(
                    findings,
                    &t.name,
                    format!("legacy `{}` is {} {:?}, expected I16 [{tiles}]", t.name, t.dtype, t.shape),
                );
            }
        }
        (None, None) => {
            let expected = format!("{prefix}.{leaf}");
            err(findings, &expected, format!("packed matrix `{prefix}` has no `{expected}` (F16 [{len}])"));
        }
    }
}

fn check_marker(
    t: &Tensor,
    expected: [u8; 4],
    markers: &mut MarkerReader<'_>,
    markers_checked: bool,
    findings: &mut Vec<Finding>,
) -> Result<(), CheckpointError> {
    if t.dtype != Dtype::I32 || !t.shape.is_empty() {
        err(
            findings,
            &t.name,
            format!("codebook marker `{}` is {} {:?}, expected a 0-d I32 scalar", t.name, t.dtype, t.shape),
        );
        return Ok(());
    }
    if !markers_checked {
        return Ok(());
    }
    match markers.first4(t)? {
        Some(bytes) if bytes == expected => {}
        Some(bytes) => err(
            findings,
            &t.name,
            format!(
                "codebook marker `{}` holds 0x{:08X}, expected 0x{:08X} (packed ABI mismatch)",
                t.name,
                u32::from_le_bytes(bytes),
                u32::from_le_bytes(expected)
            ),
        ),
        None => {
            if matches!(markers.origin(), Origin::Virtual { .. }) {
                err(findings, &t.name, format!("virtual checkpoint recorded no value for marker `{}`", t.name));
            }
        }
    }
    Ok(())
}
