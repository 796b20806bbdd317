//! Where a booting vLLM is, read from its log lines: starting, loading weights (shard k of N),
//! compiling, sizing the KV cache, capturing graphs, starting the API server. Pure; the node
//! agent feeds it every engine line and reports the phase in its heartbeats (for `up`'s progress
//! line and `status`). The patterns are vLLM's own messages (tests/fixtures/vllm-boot-cpu.log
//! holds a real boot of the CPU build; the GPU-only ones are vLLM's messages as written).

use serde::{Deserialize, Serialize};

/// A boot phase, in the order vLLM goes through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Starting,
    EngineCore,
    Distributed,
    LoadingModel,
    LoadingWeights,
    WeightsLoaded,
    /// The overlay's EXL3 layers made ready one by one (`exl3: … ready on cpu …, layer 9`).
    Exl3Layers,
    Compiling,
    KvCache,
    CapturingGraphs,
    EngineReady,
    ApiServer,
}

/// The phase, with the progress of a counted one (`3/39` shards, `12/67` graphs; `(9, 0)`: the
/// ninth of an unknown number).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Phase {
    pub stage: Stage,
    pub step: Option<(u32, u32)>,
}

impl Phase {
    /// Human text, e.g. `loading weights: shard 3/39`.
    #[must_use]
    pub fn describe(&self) -> String {
        let base = match self.stage {
            Stage::Starting => "starting vLLM",
            Stage::EngineCore => "starting the engine core",
            Stage::Distributed => "connecting the ranks (distributed init)",
            Stage::LoadingModel => "loading the model",
            Stage::LoadingWeights => "loading weights",
            Stage::WeightsLoaded => "weights loaded",
            Stage::Exl3Layers => "preparing EXL3 layers",
            Stage::Compiling => "compiling the model (torch.compile)",
            Stage::KvCache => "sizing the KV cache",
            Stage::CapturingGraphs => "capturing graphs",
            Stage::EngineReady => "engine initialised, starting the API server",
            Stage::ApiServer => "API server started, waiting for /health",
        };
        match (self.stage, self.step) {
            (Stage::LoadingWeights, Some((k, n))) => format!("{base}: shard {k}/{n}"),
            (_, Some((k, 0))) => format!("{base}: {k}"),
            (_, Some((k, n))) => format!("{base}: {k}/{n}"),
            _ => base.to_string(),
        }
    }
}

/// The first `k/N` token of a progress bar line (`| 3/39 [00:10<…`).
fn step_of(text: &str) -> Option<(u32, u32)> {
    text.split(|c: char| c.is_whitespace() || c == '|').find_map(|tok| {
        let (k, n) = tok.split_once('/')?;
        Some((k.parse().ok()?, n.parse().ok()?))
    })
}

/// The phase a single log line announces, if any.
#[must_use]
pub fn phase_of(line: &str) -> Option<Phase> {
    let has = |s: &str| line.contains(s);
    let at = |stage| Some(Phase { stage, step: None });
    if has("Loading safetensors checkpoint shards") || has("Loading pt checkpoint shards") {
        return Some(Phase { stage: Stage::LoadingWeights, step: step_of(line.split("Completed").nth(1)?) });
    }
    if has("Capturing CUDA graphs") || has("Capturing cudagraphs") {
        let after = line.split_once('%').map_or(line, |(_, r)| r);
        return Some(Phase { stage: Stage::CapturingGraphs, step: step_of(after) });
    }
    if has("Graph capturing finished") {
        return at(Stage::CapturingGraphs);
    }
    if has("init engine (profile, create kv cache, warmup model) took") {
        return at(Stage::EngineReady);
    }
    if has("Starting vLLM API server")
        || has("Starting vLLM server on")
        || has("Available routes are")
        || has("Application startup complete")
    {
        return at(Stage::ApiServer);
    }
    if has("KV cache size:") || has("Available KV cache memory") || has("Maximum concurrency for") {
        return at(Stage::KvCache);
    }
    // Not any "torch.compile" (`Enforce eager set, disabling torch.compile` is logged early).
    if has("torch.compile takes")
        || has("Dynamo bytecode transform time")
        || has("Compiling a graph for")
        || has("Directly load the compiled graph")
    {
        return at(Stage::Compiling);
    }
    if has("exl3: ") && has(" ready on ") {
        let layer = line.rsplit_once(", layer ").and_then(|(_, r)| r.split_whitespace().next()?.parse().ok());
        return Some(Phase { stage: Stage::Exl3Layers, step: layer.map(|k| (k, 0)) });
    }
    if has("Loading weights took") || has("Model loading took") {
        return at(Stage::WeightsLoaded);
    }
    if has("Starting to load model") {
        return at(Stage::LoadingModel);
    }
    if has("distributed_init_method=") || has("world_size=") && has("rank=") {
        return at(Stage::Distributed);
    }
    if has("Initializing a V1 LLM engine") || has("Waiting for init message from front-end") {
        return at(Stage::EngineCore);
    }
    if has("vLLM API server version") || has("non-default args:") {
        return at(Stage::Starting);
    }
    None
}

/// The phase so far of one boot: it only moves forward (lines of several processes interleave),
/// while a counted phase updates its count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tracker {
    current: Option<Phase>,
}

impl Tracker {
    /// Feed one log line; true when the phase (or its count) changed.
    pub fn observe(&mut self, line: &str) -> bool {
        let Some(p) = phase_of(line) else { return false };
        let newer = match &self.current {
            None => true,
            Some(c) if p.stage > c.stage => true,
            Some(c) if p.stage == c.stage => p.step.is_some() && p.step != c.step,
            Some(_) => false,
        };
        if newer {
            self.current = Some(p);
        }
        newer
    }

    #[must_use]
    pub fn current(&self) -> Option<&Phase> {
        self.current.as_ref()
    }
}

/// `65` → `1m05s`, `3725` → `1h02m05s`: the elapsed time on the progress line.
#[must_use]
pub fn elapsed(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{}h{:02}m{:02}s", s / 3600, s / 60 % 60, s % 60),
    }
}

/// The progress line between "engine started" and "/health answered 200":
/// `    booting 1m05s: node-a: loading weights: shard 3/39`.
#[must_use]
pub fn progress_line(elapsed_s: u64, phases: &[(String, Option<String>)]) -> String {
    let parts: Vec<String> =
        phases.iter().map(|(node, p)| format!("{node}: {}", p.as_deref().unwrap_or("starting"))).collect();
    format!("    booting {}: {}", elapsed(elapsed_s), parts.join("; "))
}

/// How often the progress line is written: redrawn in place every tick on a terminal, a new
/// line once a minute otherwise (logs, CI).
#[derive(Debug, Clone)]
pub struct Pacer {
    tty: bool,
    next_line_s: u64,
}

/// Erase the current terminal line.
pub const CLEAR_LINE: &str = "\r\x1b[2K";

impl Pacer {
    #[must_use]
    pub fn new(tty: bool) -> Self {
        Self { tty, next_line_s: 60 }
    }

    /// What to write at `elapsed_s` for `line` (nothing when it is not time yet).
    pub fn tick(&mut self, elapsed_s: u64, line: &str) -> Option<String> {
        if self.tty {
            return Some(format!("{CLEAR_LINE}{line}"));
        }
        if elapsed_s >= self.next_line_s {
            self.next_line_s = (elapsed_s / 60 + 1) * 60;
            return Some(format!("{line}\n"));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_bars_give_their_counts() {
        let l = "(EngineCore_DP0 pid=123) Loading safetensors checkpoint shards:  33% Completed | 13/39 [03:10<06:20,  7.31s/it]";
        assert_eq!(phase_of(l), Some(Phase { stage: Stage::LoadingWeights, step: Some((13, 39)) }));
        assert_eq!(phase_of(l).unwrap().describe(), "loading weights: shard 13/39");
        let g = "(EngineCore_DP0 pid=9) Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  45%|████▌     | 30/67 [00:02<00:03, 12.1it/s]";
        assert_eq!(phase_of(g).unwrap().describe(), "capturing graphs: 30/67");
        assert_eq!(phase_of("INFO 12-03 10:00:00 [core.py:1] something else"), None);
        assert_eq!(elapsed(5), "5s");
        assert_eq!(elapsed(65), "1m05s");
        assert_eq!(elapsed(3725), "1h02m05s");
    }

    /// A real boot of the CPU build (vLLM 0.32.0, tiny-cpu kit, as spark-kit logs it).
    #[test]
    fn real_cpu_boot_goes_through_its_phases_in_order() {
        let log = include_str!("../../tests/fixtures/vllm-boot-cpu.log");
        let mut t = Tracker::default();
        let mut seen = Vec::new();
        for line in log.lines() {
            for part in line.split('\r') {
                if t.observe(part) {
                    seen.push(t.current().unwrap().describe());
                }
            }
        }
        assert_eq!(
            seen,
            [
                "starting vLLM",
                "starting the engine core",
                "connecting the ranks (distributed init)",
                "loading the model",
                "loading weights: shard 0/1",
                "loading weights: shard 1/1",
                "weights loaded",
                "preparing EXL3 layers: 1",
                "preparing EXL3 layers: 2",
                "preparing EXL3 layers: 3",
                "preparing EXL3 layers: 4",
                "preparing EXL3 layers: 5",
                "preparing EXL3 layers: 6",
                "preparing EXL3 layers: 7",
                "preparing EXL3 layers: 8",
                "preparing EXL3 layers: 9",
                "sizing the KV cache",
                "engine initialised, starting the API server",
                "API server started, waiting for /health",
            ]
        );
    }

    #[test]
    fn progress_is_a_line_a_minute_without_a_tty_and_redrawn_on_one() {
        let phases =
            vec![("node-a".to_string(), Some("loading weights: shard 3/39".to_string())), ("node-b".into(), None)];
        let line = progress_line(65, &phases);
        assert_eq!(line, "    booting 1m05s: node-a: loading weights: shard 3/39; node-b: starting");
        let mut p = Pacer::new(false);
        let printed: Vec<u64> = (0..200).filter(|s| p.tick(*s, &line).is_some()).collect();
        assert_eq!(printed, [60, 120, 180]);
        // A stalled ticker (suspended, slow) does not print twice for one minute.
        let mut p = Pacer::new(false);
        assert!(p.tick(130, &line).is_some());
        assert!(p.tick(150, &line).is_none());
        assert!(p.tick(180, &line).is_some());
        let mut t = Pacer::new(true);
        assert_eq!(t.tick(1, "x").as_deref(), Some("\r\x1b[2Kx"));
    }

    #[test]
    fn tracker_moves_forward_only_and_updates_counts() {
        let mut t = Tracker::default();
        assert!(t.observe("INFO [loader.py:1] Starting to load model /m..."));
        assert!(t.observe("Loading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]"));
        assert!(t.observe("Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.0s/it]"));
        assert!(!t.observe("Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.0s/it]"));
        // A late line of an earlier phase (another process) does not move it back.
        assert!(!t.observe("(Worker pid=3) INFO Starting to load model /m..."));
        assert_eq!(t.current().unwrap().step, Some((1, 2)));
        assert!(t.observe("INFO [api_server.py:1] Starting vLLM API server 0 on http://127.0.0.1:8000"));
        assert_eq!(t.current().unwrap().stage, Stage::ApiServer);
    }
}
