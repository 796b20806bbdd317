//! Built-in kits, compiled into the binary from `launch-kits/`.

/// A built-in kit: its name, the path it has in the source tree, and its text.
#[derive(Debug, Clone, Copy)]
pub struct Builtin {
    pub name: &'static str,
    pub path: &'static str,
    pub text: &'static str,
}

macro_rules! builtin {
    ($name:literal) => {
        Builtin {
            name: $name,
            path: concat!("launch-kits/", $name, ".yaml"),
            text: include_str!(concat!("../../launch-kits/", $name, ".yaml")),
        }
    };
}

/// Every built-in kit; the first is the default.
pub const BUILTINS: &[Builtin] = &[
    builtin!("dgx-spark-2x-dsv41-exl3"),
    builtin!("dgx-spark-2x-dsv41-exl3-docker"),
    builtin!("tiny-cpu"),
    builtin!("tiny-cpu-2node"),
    builtin!("tiny-cpu-docker"),
    builtin!("tiny-cpu-docker-2node"),
];

/// The kit used when `--kit` is not given.
pub const DEFAULT_KIT: &str = "dgx-spark-2x-dsv41-exl3";

#[must_use]
pub fn find(name: &str) -> Option<&'static Builtin> {
    BUILTINS.iter().find(|b| b.name == name)
}
