//! The library half of the `varlen-attn` program: reading and writing safetensors files,
//! parsing shape selections, and the failure type with its exit code. The binary
//! (`src/main.rs`) parses arguments and runs the commands.

pub mod selection;
pub mod tensors;

/// A failure with its exit code.
#[derive(Debug)]
pub struct Failure {
    /// What went wrong, for a person.
    pub message: String,
    /// The process exit code: 2 for bad input, 1 otherwise.
    pub code: u8,
}

impl Failure {
    /// Bad arguments or input files: exit code 2.
    pub fn input(message: String) -> Self {
        Failure { message, code: 2 }
    }
    /// Anything else: exit code 1.
    pub fn runtime(message: String) -> Self {
        Failure { message, code: 1 }
    }
    /// A library error: bad input unless it is about the GPU.
    pub fn from_library(error: varlen_attn::Error) -> Self {
        use varlen_attn::Error::*;
        match error {
            Gpu(_) | NoDevice(_) | GpuNotCompiled | GpuUnsupported(_) | IsaUnavailable { .. } => {
                Failure::runtime(error.to_string())
            }
            _ => Failure::input(error.to_string()),
        }
    }
}

impl core::fmt::Display for Failure {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.message)
    }
}
