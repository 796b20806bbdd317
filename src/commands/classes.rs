//! Every library error a command meets, classified for `main` in one table: its exit class
//! (docs/cli.md: 1 runtime, 2 usage / configuration) and its one-line fix. With these a command
//! ends a fallible call in `?` and the failure keeps the error's whole `source()` chain.

use crate::bench::client::BenchError;
use crate::bench::key::KeyError;
use crate::bench::plot::PlotError;
use crate::checkpoint::budget::BudgetError;
use crate::checkpoint::CheckpointError;
use crate::deploy::keys::KeysError;
use crate::dirs::HomeUnset;
use crate::engine::embed::EmbedError;
use crate::engram::EngramError;
use crate::error::{Classified, ExitCode};
use crate::gateway::{ConfigError, FrontError};
use crate::hub::kit_files::NothingToFetch;
use crate::hub::HubError;
use crate::kit::KitError;
use crate::memguard::GuardError;
use crate::runtime::venv::{build::SetupError, recipe::RecipeError};
use crate::runtime::UpError;
use crate::supervisor::control::ControlError;

const fn usage_if(usage: bool) -> ExitCode {
    if usage {
        ExitCode::Usage
    } else {
        ExitCode::Runtime
    }
}

// Runtime failures with no fix of their own.
impl Classified for std::io::Error {}
impl Classified for serde_json::Error {}
impl Classified for serde_yaml::Error {}
impl Classified for CheckpointError {}
impl Classified for EmbedError {}
impl Classified for FrontError {}
impl Classified for ControlError {}

// Configuration errors: the kit or a flag names something that cannot work.
macro_rules! usage {
    ($($t:ty),+) => {$(
        impl Classified for $t {
            fn exit_code(&self) -> ExitCode {
                ExitCode::Usage
            }
        }
    )+};
}
usage!(BudgetError, KeysError, ConfigError, RecipeError, HomeUnset);

impl Classified for KitError {
    fn exit_code(&self) -> ExitCode {
        ExitCode::Usage
    }
    fn hint(&self) -> Option<String> {
        KitError::hint(self)
    }
}
impl Classified for NothingToFetch {
    fn exit_code(&self) -> ExitCode {
        ExitCode::Usage
    }
    fn hint(&self) -> Option<String> {
        Some(NothingToFetch::hint(self).into())
    }
}
impl Classified for KeyError {
    fn exit_code(&self) -> ExitCode {
        ExitCode::Usage
    }
    fn hint(&self) -> Option<String> {
        Some(KeyError::hint(self))
    }
}

// Errors that say their own class.
impl Classified for HubError {
    fn exit_code(&self) -> ExitCode {
        usage_if(self.is_config())
    }
    fn hint(&self) -> Option<String> {
        HubError::hint(self)
    }
}
impl Classified for EngramError {
    fn exit_code(&self) -> ExitCode {
        usage_if(self.is_config())
    }
    fn hint(&self) -> Option<String> {
        EngramError::hint(self).map(Into::into)
    }
}
impl Classified for BenchError {
    fn exit_code(&self) -> ExitCode {
        usage_if(self.is_usage())
    }
    fn hint(&self) -> Option<String> {
        BenchError::hint(self)
    }
}

// Runtime failures with a fix.
impl Classified for UpError {
    fn hint(&self) -> Option<String> {
        UpError::hint(self)
    }
}
impl Classified for PlotError {
    fn hint(&self) -> Option<String> {
        Some(PlotError::hint(self).into())
    }
}
impl Classified for SetupError {
    fn hint(&self) -> Option<String> {
        self.log().map(|l| format!("full install log: {}", l.display()))
    }
}
impl Classified for GuardError {
    fn hint(&self) -> Option<String> {
        Some(
            match self {
                GuardError::Receipts { .. } => "pass --receipts DIR with a directory you can write",
                GuardError::Floors { .. } => "raise --soft or lower --hard",
                GuardError::Open { .. } | GuardError::Meminfo { .. } => {
                    "the guard needs Linux /proc (meminfo and per-process stat)"
                }
            }
            .into(),
        )
    }
}
