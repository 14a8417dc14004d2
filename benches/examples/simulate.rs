//! A deterministic simulation of claim admission against a backend whose
//! latency rises with concurrency, on virtual time.
//!
//! The controller is the real [`Admission`]; only the world around it is
//! made up. Claims arrive as Poisson streams from one greedy key and many
//! light keys; an admitted claim holds its permit for a service time that
//! grows with the number of claims in flight, like a database whose
//! transactions slow down as more of them run at once. Nothing sleeps: a
//! discrete-event loop jumps from one instant to the next (an arrival, a
//! completion, a waiter's deadline from `poll_timeout`, a sample), so a few
//! minutes of traffic take a fraction of a second and every run prints the
//! same figures.
//!
//! ```text
//! cargo run --release -p tessera-benches --example simulate [-- --out PATH]
//! ```
//!
//! It prints a summary per phase and writes an SVG chart (default
//! `target/tessera-simulation.svg`) of the concurrency limit, in-flight
//! claims, waiting claims, the latency average against the target, and
//! grants per key over time.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::error::Error;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use plotters::coord::Shift;
use plotters::prelude::*;
use tessera_admission::{Admission, AdmissionConfig, Event, Offer, Permit, RejectReason, Ticket};

/// The principal of the greedy key; light keys are `1..=LIGHT_KEYS`.
const GREEDY: u32 = 0;
const LIGHT_KEYS: u32 = 60;
/// How often the chart samples the controller.
const SAMPLE: Duration = Duration::from_millis(250);
/// Width of the windows over which grants and 429s are counted per second.
const RATE_WINDOW: Duration = Duration::from_secs(1);
const SEED: u64 = 0x7e55_e7a0;

/// A stretch of traffic with its arrival rates and backend speed.
struct Phase {
    name: &'static str,
    what: &'static str,
    seconds: u64,
    /// Claims a second from all light keys together.
    light_rate: f64,
    /// Claims a second from the greedy key.
    greedy_rate: f64,
    /// Multiplies every service time (a storage stall).
    slowdown: f64,
}

const PHASES: [Phase; 6] = [
    Phase {
        name: "steady",
        what: "light keys well within capacity",
        seconds: 15,
        light_rate: 60.0,
        greedy_rate: 0.0,
        slowdown: 1.0,
    },
    Phase {
        name: "step",
        what: "demand more than doubles",
        seconds: 35,
        light_rate: 135.0,
        greedy_rate: 0.0,
        slowdown: 1.0,
    },
    Phase {
        name: "overload",
        what: "demand twice what the backend serves",
        seconds: 25,
        light_rate: 300.0,
        greedy_rate: 0.0,
        slowdown: 1.0,
    },
    Phase {
        name: "stall",
        what: "overload while the backend is 3x slower",
        seconds: 15,
        light_rate: 300.0,
        greedy_rate: 0.0,
        slowdown: 3.0,
    },
    Phase {
        name: "recovery",
        what: "demand back to steady",
        seconds: 30,
        light_rate: 60.0,
        greedy_rate: 0.0,
        slowdown: 1.0,
    },
    Phase {
        name: "greedy",
        what: "one key floods beside 60 light keys",
        seconds: 40,
        light_rate: 80.0,
        greedy_rate: 300.0,
        slowdown: 1.0,
    },
];

/// The synthetic backend: a service time of `base × (1 + n / knee)` with `n`
/// claims in flight, so throughput approaches `knee / base` while latency
/// keeps rising; ±25% jitter.
struct Backend {
    base: Duration,
    knee: f64,
}

impl Backend {
    fn service_time(&self, in_flight: u32, slowdown: f64, rng: &mut Rng) -> Duration {
        let load = 1.0 + f64::from(in_flight) / self.knee;
        let jitter = 0.75 + 0.5 * rng.unit();
        self.base.mul_f64(load * slowdown * jitter)
    }
}

/// SplitMix64: a small, seeded generator, so every run is the same.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The gap to the next arrival of a Poisson stream of `rate` a second.
    fn gap(&mut self, rate: f64) -> Duration {
        Duration::from_secs_f64(-(1.0 - self.unit()).ln() / rate)
    }

    fn light_key(&mut self) -> u32 {
        1 + (self.next() % u64::from(LIGHT_KEYS)) as u32
    }
}

/// A Poisson stream whose rate changes at phase boundaries. Arrivals are
/// memoryless, so a gap that crosses a boundary is simply drawn again there
/// at the new rate.
struct Stream {
    next: Duration,
}

impl Stream {
    fn schedule(&mut self, from: Duration, rate: f64, phase_end: Duration, rng: &mut Rng) {
        self.next = if rate > 0.0 {
            (from + rng.gap(rate)).min(phase_end)
        } else {
            phase_end
        };
    }
}

/// What one phase saw.
#[derive(Default)]
struct Tally {
    offered: [u64; 2],
    granted: [u64; 2],
    /// Claims admitted at once, without waiting.
    immediate: u64,
    queue_full: u64,
    wait_expired: u64,
    fair_share: u64,
    /// Of granted claims, admitted at once or after waiting.
    waits: [Vec<Duration>; 2],
    limit_min: u32,
    limit_max: u32,
}

impl Tally {
    fn new(limit: u32) -> Self {
        Self {
            limit_min: limit,
            limit_max: limit,
            ..Self::default()
        }
    }

    fn reject(&mut self, reason: RejectReason) {
        match reason {
            RejectReason::QueueFull => self.queue_full += 1,
            RejectReason::WaitExpired => self.wait_expired += 1,
            RejectReason::FairShare => self.fair_share += 1,
            other => panic!("unexpected rejection: {other}"),
        }
    }

    fn rejected(&self) -> u64 {
        self.queue_full + self.wait_expired + self.fair_share
    }
}

/// Index into per-class arrays: light keys, then the greedy key.
fn class(key: u32) -> usize {
    usize::from(key == GREEDY)
}

/// One point of the chart.
#[derive(Clone, Copy)]
struct Sample {
    seconds: f64,
    limit: u32,
    in_flight: u32,
    pending: usize,
    latency_ms: Option<f64>,
}

/// Counts per [`RATE_WINDOW`], for the per-second series.
#[derive(Default, Clone, Copy)]
struct Window {
    offered: [u32; 2],
    granted: [u32; 2],
    rejected: u32,
}

struct Simulation {
    gate: Admission<u32>,
    start: Instant,
    now: Duration,
    rng: Rng,
    backend: Backend,
    /// Completions by time; the sequence number breaks ties and keys
    /// `running`.
    completions: BinaryHeap<Reverse<(Duration, u64)>>,
    running: HashMap<u64, Permit>,
    next_run: u64,
    parked: HashMap<Ticket, u32>,
    phase: usize,
    tallies: Vec<Tally>,
    samples: Vec<Sample>,
    windows: Vec<Window>,
}

impl Simulation {
    fn new(config: AdmissionConfig, backend: Backend) -> Result<Self, Box<dyn Error>> {
        // The only clock read: virtual time counts from here.
        let start = Instant::now();
        let limit = config.initial_concurrency;
        Ok(Self {
            gate: Admission::new(config, start)?,
            start,
            now: Duration::ZERO,
            rng: Rng(SEED),
            backend,
            completions: BinaryHeap::new(),
            running: HashMap::new(),
            next_run: 0,
            parked: HashMap::new(),
            phase: 0,
            tallies: vec![Tally::new(limit)],
            samples: Vec::new(),
            windows: Vec::new(),
        })
    }

    fn instant(&self) -> Instant {
        self.start + self.now
    }

    fn tally(&mut self) -> &mut Tally {
        &mut self.tallies[self.phase]
    }

    fn window(&mut self) -> &mut Window {
        let index = (self.now.as_nanos() / RATE_WINDOW.as_nanos()) as usize;
        if self.windows.len() <= index {
            self.windows.resize(index + 1, Window::default());
        }
        &mut self.windows[index]
    }

    fn run(&mut self) {
        let mut light = Stream {
            next: Duration::ZERO,
        };
        let mut greedy = Stream {
            next: Duration::ZERO,
        };
        let mut phase_end = Duration::ZERO;
        let mut next_sample = Duration::ZERO;
        for (index, phase) in PHASES.iter().enumerate() {
            self.enter(index);
            let phase_start = phase_end;
            phase_end += Duration::from_secs(phase.seconds);
            light.schedule(phase_start, phase.light_rate, phase_end, &mut self.rng);
            greedy.schedule(phase_start, phase.greedy_rate, phase_end, &mut self.rng);
            loop {
                let deadline = self
                    .gate
                    .poll_timeout()
                    .map(|at| at.saturating_duration_since(self.start));
                let completion = self.completions.peek().map(|Reverse((at, _))| *at);
                let next = [Some(light.next), Some(greedy.next), deadline, completion]
                    .into_iter()
                    .flatten()
                    .chain([next_sample, phase_end])
                    .min()
                    .expect("the phase end is always there");
                if next >= phase_end {
                    break;
                }
                self.now = next;
                self.complete();
                if light.next <= self.now {
                    let key = self.rng.light_key();
                    self.offer(key);
                    light.schedule(self.now, phase.light_rate, phase_end, &mut self.rng);
                }
                if greedy.next <= self.now {
                    self.offer(GREEDY);
                    greedy.schedule(self.now, phase.greedy_rate, phase_end, &mut self.rng);
                }
                self.drain();
                if next_sample <= self.now {
                    self.sample();
                    next_sample += SAMPLE;
                }
            }
            self.now = phase_end;
        }
        self.sample();
    }

    fn enter(&mut self, phase: usize) {
        if phase != self.phase {
            self.phase = phase;
            let limit = self.gate.stats().limit;
            self.tallies.push(Tally::new(limit));
        }
    }

    /// Releases every claim whose service ends now.
    fn complete(&mut self) {
        while let Some(&Reverse((at, run))) = self.completions.peek() {
            if at > self.now {
                break;
            }
            self.completions.pop();
            let permit = self.running.remove(&run).expect("every run holds a permit");
            self.gate.release(permit, self.instant());
        }
    }

    fn offer(&mut self, key: u32) {
        self.tally().offered[class(key)] += 1;
        self.window().offered[class(key)] += 1;
        match self.gate.offer(key, self.instant()) {
            Offer::Admitted(permit) => {
                self.tally().immediate += 1;
                self.start_service(key, permit, Duration::ZERO);
            }
            Offer::Queued(ticket) => {
                self.parked.insert(ticket, key);
            }
            Offer::Rejected(rejection) => {
                self.tally().reject(rejection.reason());
                self.window().rejected += 1;
            }
        }
    }

    /// Pulls every grant and rejection the controller has for now.
    fn drain(&mut self) {
        while let Some(event) = self.gate.poll_event(self.instant()) {
            let key = self
                .parked
                .remove(&event.ticket())
                .expect("every event names a parked claim");
            match event {
                Event::Granted { permit, waited, .. } => self.start_service(key, permit, waited),
                Event::Rejected { rejection, .. } => {
                    self.tally().reject(rejection.reason());
                    self.window().rejected += 1;
                }
            }
        }
    }

    fn start_service(&mut self, key: u32, permit: Permit, waited: Duration) {
        let stats = self.gate.stats();
        let slowdown = PHASES[self.phase].slowdown;
        let service = self
            .backend
            .service_time(stats.in_flight, slowdown, &mut self.rng);
        let tally = self.tally();
        tally.granted[class(key)] += 1;
        tally.waits[class(key)].push(waited);
        tally.limit_min = tally.limit_min.min(stats.limit);
        tally.limit_max = tally.limit_max.max(stats.limit);
        self.window().granted[class(key)] += 1;
        let run = self.next_run;
        self.next_run += 1;
        self.running.insert(run, permit);
        self.completions.push(Reverse((self.now + service, run)));
    }

    fn sample(&mut self) {
        let stats = self.gate.stats();
        let tally = self.tally();
        tally.limit_min = tally.limit_min.min(stats.limit);
        tally.limit_max = tally.limit_max.max(stats.limit);
        self.samples.push(Sample {
            seconds: self.now.as_secs_f64(),
            limit: stats.limit,
            in_flight: stats.in_flight,
            pending: stats.pending,
            latency_ms: stats.latency_average.map(|d| d.as_secs_f64() * 1e3),
        });
    }
}

/// The nearest-rank percentile, in milliseconds.
fn percentile(sorted: &[Duration], fraction: f64) -> u128 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((sorted.len() as f64 * fraction).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1].as_millis()
}

fn share(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".to_owned()
    } else {
        format!("{:.0}%", 100.0 * part as f64 / whole as f64)
    }
}

fn print_summary(config: &AdmissionConfig, backend: &Backend, tallies: &[Tally]) {
    println!(
        "Admission: initial limit {}, target {} ms, max pending {}, max wait {} s.",
        config.initial_concurrency,
        config.target.as_millis(),
        config.max_pending,
        config.max_wait.as_secs(),
    );
    println!(
        "Backend: {} ms x (1 + in flight / {}) per claim, +-25%, so at most {:.0} claims/s.",
        backend.base.as_millis(),
        backend.knee,
        backend.knee / backend.base.as_secs_f64(),
    );
    println!("Keys: {LIGHT_KEYS} light keys and one greedy key; a 429 is not retried.\n");
    println!(
        "{:<9} {:>9}  {:>7} {:>7} {:>7}  {:>20}  {:>6}  {:>12}  {:>13}",
        "phase",
        "time",
        "offered",
        "granted",
        "at once",
        "429 full/expired/fair",
        "limit",
        "wait p50/p99",
        "greedy grants"
    );
    let mut start = 0;
    for (phase, tally) in PHASES.iter().zip(tallies) {
        let end = start + phase.seconds;
        let mut waits: Vec<Duration> = tally.waits.concat();
        waits.sort_unstable();
        let granted = tally.granted.iter().sum::<u64>();
        let greedy = if tally.offered[1] == 0 {
            "-".to_owned()
        } else {
            share(tally.granted[1], granted)
        };
        println!(
            "{:<9} {:>9}  {:>7} {:>7} {:>7}  {:>20}  {:>6}  {:>12}  {:>13}",
            phase.name,
            format!("{start}-{end} s"),
            tally.offered.iter().sum::<u64>(),
            granted,
            tally.immediate,
            format!(
                "{} = {}/{}/{}",
                tally.rejected(),
                tally.queue_full,
                tally.wait_expired,
                tally.fair_share
            ),
            format!("{}-{}", tally.limit_min, tally.limit_max),
            format!(
                "{}/{} ms",
                percentile(&waits, 0.5),
                percentile(&waits, 0.99)
            ),
            greedy,
        );
        start = end;
    }
    println!();
    for phase in &PHASES {
        println!("  {:<9} {}", phase.name, phase.what);
    }
    println!(
        "\nGranted counts grants made during the phase, including claims that \
         arrived earlier; waits are of granted claims (0 when admitted at once)."
    );

    let last = PHASES.len() - 1;
    let greedy = &tallies[last];
    let p99 = |class: usize| {
        let mut waits = greedy.waits[class].clone();
        waits.sort_unstable();
        percentile(&waits, 0.99)
    };
    println!(
        "In the {} phase the greedy key made {} of the offers and got {} of the grants \
         ({} of {}, wait p99 {} ms);\nthe {LIGHT_KEYS} light keys got {} of {} (wait p99 {} ms).",
        PHASES[last].name,
        share(greedy.offered[1], greedy.offered.iter().sum()),
        share(greedy.granted[1], greedy.granted.iter().sum()),
        greedy.granted[1],
        greedy.offered[1],
        p99(1),
        greedy.granted[0],
        greedy.offered[0],
        p99(0),
    );
}

fn main() -> Result<(), Box<dyn Error>> {
    let out = output_path()?;
    let config = AdmissionConfig {
        max_pending: 512,
        ..AdmissionConfig::default()
    };
    let backend = Backend {
        base: Duration::from_millis(40),
        knee: 6.0,
    };
    let mut simulation = Simulation::new(config.clone(), backend)?;
    simulation.run();
    print_summary(&config, &simulation.backend, &simulation.tallies);
    draw(&out, &config, &simulation.samples, &simulation.windows)?;
    let shown = std::fs::canonicalize(&out).unwrap_or(out);
    println!("\nChart written to {}", shown.display());
    Ok(())
}

/// `--out PATH`, or the default under `target/`.
fn output_path() -> Result<PathBuf, Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let mut out = PathBuf::from("target/tessera-simulation.svg");
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--out" => out = args.next().ok_or("--out needs a path")?.into(),
            "-h" | "--help" => {
                println!("usage: simulate [--out PATH]  (default {})", out.display());
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}; try --help").into()),
        }
    }
    Ok(out)
}

const LIMIT: RGBColor = RGBColor(31, 119, 180);
const IN_FLIGHT: RGBColor = RGBColor(255, 127, 14);
const PENDING: RGBColor = RGBColor(148, 103, 189);
const LATENCY: RGBColor = RGBColor(44, 160, 44);
const TARGET: RGBColor = RGBColor(214, 39, 40);
const LIGHT: RGBColor = RGBColor(31, 119, 180);
const LIGHT_OFFERED: RGBColor = RGBColor(158, 202, 225);
const HEAVY: RGBColor = RGBColor(214, 39, 40);
const HEAVY_OFFERED: RGBColor = RGBColor(252, 160, 150);
const REJECTED: RGBColor = RGBColor(90, 90, 90);
const BOUNDARY: RGBColor = RGBColor(205, 205, 205);

const WIDTH: u32 = 1000;
const LEGEND_WIDTH: u32 = 190;

/// A named line of a panel.
struct Series {
    name: &'static str,
    stroke: Stroke,
    points: Vec<(f64, f64)>,
}

/// Where a panel sits: the top one names the phases, the bottom one the
/// time axis.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Position {
    Top,
    Middle,
    Bottom,
}

/// How a series is drawn, for the plot and its legend.
#[derive(Clone, Copy)]
enum Stroke {
    Solid(RGBColor, u32),
    Dashed(RGBColor),
}

/// Four panels over one time axis: concurrency, waiting claims, latency,
/// and claims per second by key. Legends sit in a column to the right, so
/// they never cover a line.
fn draw(
    out: &Path,
    config: &AdmissionConfig,
    samples: &[Sample],
    windows: &[Window],
) -> Result<(), Box<dyn Error>> {
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let root = SVGBackend::new(out, (WIDTH, 1060)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "Tessera claim admission, simulated: step load, overload, recovery, a greedy key",
        ("sans-serif", 20),
    )?;
    let panels = root.split_evenly((4, 1));
    let end = PHASES.iter().map(|p| p.seconds).sum::<u64>() as f64;
    let series = |values: fn(&Sample) -> Option<f64>| -> Vec<(f64, f64)> {
        samples
            .iter()
            .filter_map(|s| Some((s.seconds, values(s)?)))
            .collect()
    };
    let per_second = |values: fn(&Window) -> u32| -> Vec<(f64, f64)> {
        windows
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let middle = (i as f64 + 0.5) * RATE_WINDOW.as_secs_f64();
                (middle, f64::from(values(w)))
            })
            .collect()
    };

    let top = samples.iter().map(|s| s.limit.max(s.in_flight)).max();
    let top = f64::from(top.unwrap_or(1)) * 1.2;
    panel(
        &panels[0],
        "Concurrency",
        "claims",
        end,
        top,
        Position::Top,
        &[
            Series {
                name: "limit",
                stroke: Stroke::Solid(LIMIT, 2),
                points: series(|s| Some(f64::from(s.limit))),
            },
            Series {
                name: "in flight",
                stroke: Stroke::Solid(IN_FLIGHT, 1),
                points: series(|s| Some(f64::from(s.in_flight))),
            },
        ],
    )?;

    let bound = config.max_pending as f64;
    panel(
        &panels[1],
        "Waiting claims",
        "claims",
        end,
        bound * 1.15,
        Position::Middle,
        &[
            Series {
                name: "waiting",
                stroke: Stroke::Solid(PENDING, 2),
                points: series(|s| Some(s.pending as f64)),
            },
            Series {
                name: "max pending",
                stroke: Stroke::Dashed(REJECTED),
                points: vec![(0.0, bound), (end, bound)],
            },
        ],
    )?;

    let target = config.target.as_secs_f64() * 1e3;
    let slowest = samples
        .iter()
        .filter_map(|s| s.latency_ms)
        .fold(target, f64::max);
    panel(
        &panels[2],
        "Service time of admitted claims",
        "ms",
        end,
        slowest * 1.15,
        Position::Middle,
        &[
            Series {
                name: "average",
                stroke: Stroke::Solid(LATENCY, 2),
                points: series(|s| s.latency_ms),
            },
            Series {
                name: "target",
                stroke: Stroke::Dashed(TARGET),
                points: vec![(0.0, target), (end, target)],
            },
        ],
    )?;

    let busiest = windows
        .iter()
        .flat_map(|w| w.offered.iter().chain(&w.granted).chain([&w.rejected]))
        .copied()
        .max();
    panel(
        &panels[3],
        "Claims per second, by key",
        "claims / s",
        end,
        f64::from(busiest.unwrap_or(1)) * 1.15,
        Position::Bottom,
        &[
            Series {
                name: "greedy key: offered",
                stroke: Stroke::Solid(HEAVY_OFFERED, 1),
                points: per_second(|w| w.offered[1]),
            },
            Series {
                name: "greedy key: granted",
                stroke: Stroke::Solid(HEAVY, 2),
                points: per_second(|w| w.granted[1]),
            },
            Series {
                name: "60 light keys: offered",
                stroke: Stroke::Solid(LIGHT_OFFERED, 1),
                points: per_second(|w| w.offered[0]),
            },
            Series {
                name: "60 light keys: granted",
                stroke: Stroke::Solid(LIGHT, 2),
                points: per_second(|w| w.granted[0]),
            },
            Series {
                name: "429 rate_limited",
                stroke: Stroke::Solid(REJECTED, 1),
                points: per_second(|w| w.rejected),
            },
        ],
    )?;

    root.present()?;
    Ok(())
}

/// One panel: its series on the left, its legend in a column on the right,
/// phase boundaries as vertical lines.
fn panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    unit: &str,
    end: f64,
    top: f64,
    position: Position,
    series: &[Series],
) -> Result<(), Box<dyn Error>> {
    let (plot, legend) = area.split_horizontally(WIDTH - LEGEND_WIDTH);
    let mut chart = ChartBuilder::on(&plot)
        .caption(title, ("sans-serif", 16))
        .margin_top(4)
        .margin_left(8)
        .margin_right(16)
        .margin_bottom(4)
        .x_label_area_size(if position == Position::Bottom { 36 } else { 20 })
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..end, 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .bold_line_style(RGBColor(235, 235, 235))
        .x_labels(17)
        .y_labels(5)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .x_desc(if position == Position::Bottom {
            "virtual time (s)"
        } else {
            ""
        })
        .y_desc(unit)
        .label_style(("sans-serif", 12))
        .draw()?;
    let mut start = 0.0;
    for phase in &PHASES {
        if start > 0.0 {
            chart.draw_series(LineSeries::new([(start, 0.0), (start, top)], BOUNDARY))?;
        }
        if position == Position::Top {
            let style = TextStyle::from(("sans-serif", 13)).color(&BLACK);
            chart.draw_series([Text::new(phase.name, (start + 1.0, top * 0.97), style)])?;
        }
        start += phase.seconds as f64;
    }
    for Series { stroke, points, .. } in series {
        match *stroke {
            Stroke::Solid(color, width) => {
                chart.draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(width),
                ))?;
            }
            Stroke::Dashed(color) => {
                chart.draw_series(DashedLineSeries::new(
                    points.iter().copied(),
                    6,
                    4,
                    color.stroke_width(1),
                ))?;
            }
        }
    }

    let label = TextStyle::from(("sans-serif", 12)).color(&BLACK);
    for (row, Series { name, stroke, .. }) in series.iter().enumerate() {
        let y = 40 + 20 * row as i32;
        let segment = match *stroke {
            Stroke::Solid(color, width) => {
                vec![PathElement::new(
                    [(4, y), (34, y)],
                    color.stroke_width(width),
                )]
            }
            Stroke::Dashed(color) => [(4, 12), (18, 26), (32, 34)]
                .into_iter()
                .map(|(from, to)| PathElement::new([(from, y), (to, y)], color.stroke_width(1)))
                .collect(),
        };
        for element in segment {
            legend.draw(&element)?;
        }
        legend.draw(&Text::new(*name, (42, y - 7), label.clone()))?;
    }
    Ok(())
}
