//! NVML per-process GPU memory, loaded at run time: a CUDA process that holds 1 GiB must show up
//! with at least that much. Skips (saying why) where libnvidia-ml or a CUDA-capable python is absent;
//! `SPARK_KIT_TEST_CUDA_PYTHON` names a python with torch + CUDA (default `python3`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use spark_kit::memguard::nvml::Nvml;

const HOLD_1GIB: &str = "import sys, time\n\
try:\n    import torch\n    assert torch.cuda.is_available()\n\
except Exception as e:\n    print('nocuda', e, flush=True); sys.exit(0)\n\
x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); x.fill_(1); torch.cuda.synchronize()\n\
print('ready', flush=True); time.sleep(120)\n";

#[test]
fn nvml_reports_a_cuda_process_and_its_memory() {
    let mut nvml = match Nvml::load() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("skipping: NVML is not available here: {e}");
            return;
        }
    };
    assert!(nvml.devices() > 0);
    let python = std::env::var("SPARK_KIT_TEST_CUDA_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut child = Command::new(&python).args(["-c", HOLD_1GIB]).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    if !line.starts_with("ready") {
        let _ = child.kill();
        let _ = child.wait();
        eprintln!("skipping: {python} cannot hold CUDA memory: {}", line.trim());
        return;
    }
    let pid = i32::try_from(child.id()).unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    let mut seen = 0;
    while seen == 0 && Instant::now() < until {
        nvml.for_each_process(|p, bytes| {
            if p == pid {
                seen += bytes;
            }
        })
        .unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    eprintln!("NVML ({}): pid {pid} holds {} MiB of GPU memory", nvml.api, seen >> 20);
    assert!(seen >= 1 << 30, "NVML saw {seen} bytes for pid {pid}");
}
