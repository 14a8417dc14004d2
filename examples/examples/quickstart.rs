//! A burst of claims through Tessera's admission controller, on virtual time.
//!
//! 1,000 claims arrive within 200 ms, nine in ten from one heavy worker key,
//! against a starting window of 32. Nothing sleeps: the program jumps from one
//! instant to the next, the way a host's timer would wake it.
//!
//! Run: `cargo run --release --example quickstart`

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use tessera_admission::{Admission, AdmissionConfig, Event, Offer, Permit, Ticket};

const CLAIMS: u64 = 1_000;
const BURST: Duration = Duration::from_millis(200);
const HEAVY: &str = "heavy-worker";
const LIGHT: &str = "light-worker";

/// The database behind the gate slows down as more claims run at once.
fn service_time(in_flight: u32) -> Duration {
    Duration::from_micros(40_000 + 1_500 * u64::from(in_flight))
}

struct Run {
    gate: Admission<&'static str>,
    /// Claims running, by when they finish.
    finishing: BinaryHeap<Reverse<(Instant, u64)>>,
    permits: HashMap<u64, Permit>,
    parked: HashMap<Ticket, (&'static str, Instant)>,
    next_run: u64,
    waits: Vec<(&'static str, Duration)>,
    at_once: usize,
    rejected: usize,
}

impl Run {
    fn start(&mut self, permit: Permit, now: Instant) {
        let due = now + service_time(self.gate.stats().in_flight);
        self.finishing.push(Reverse((due, self.next_run)));
        self.permits.insert(self.next_run, permit);
        self.next_run += 1;
    }

    fn arrive(&mut self, principal: &'static str, now: Instant) {
        match self.gate.offer(principal, now) {
            Offer::Admitted(permit) => {
                self.at_once += 1;
                self.waits.push((principal, Duration::ZERO));
                self.start(permit, now);
            }
            Offer::Queued(ticket) => {
                self.parked.insert(ticket, (principal, now));
            }
            Offer::Rejected(rejection) => {
                println!("429 {rejection}");
                self.rejected += 1;
            }
        }
    }

    /// After every input, pull grants and rejections until there are none.
    fn drain(&mut self, now: Instant) {
        while let Some(event) = self.gate.poll_event(now) {
            match event {
                Event::Granted {
                    ticket,
                    permit,
                    waited,
                } => {
                    let (principal, _) = self.parked.remove(&ticket).expect("parked");
                    self.waits.push((principal, waited));
                    self.start(permit, now);
                }
                Event::Rejected { ticket, rejection } => {
                    self.parked.remove(&ticket);
                    println!("429 {rejection}");
                    self.rejected += 1;
                }
            }
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn seconds(duration: Duration) -> String {
    format!("{:.2} s", duration.as_secs_f64())
}

fn main() -> Result<(), tessera_admission::ConfigError> {
    // The host reads its clock once; the controller only receives instants.
    let t0 = Instant::now();
    let config = AdmissionConfig::default();
    let mut run = Run {
        gate: Admission::new(config.clone(), t0)?,
        finishing: BinaryHeap::new(),
        permits: HashMap::new(),
        parked: HashMap::new(),
        next_run: 0,
        waits: Vec::new(),
        at_once: 0,
        rejected: 0,
    };
    println!(
        "{CLAIMS} claims within {} ms (9 in 10 from {HEAVY}, the rest from {LIGHT}),\n\
         starting window {}, each claim taking 40 ms + 1.5 ms per claim in flight.\n",
        BURST.as_millis(),
        config.initial_concurrency,
    );
    let arrivals: Vec<(Instant, &str)> = (0..CLAIMS)
        .map(|n| {
            let at = t0 + BURST * n as u32 / CLAIMS as u32;
            (at, if n % 10 == 9 { LIGHT } else { HEAVY })
        })
        .collect();
    let mut arrivals = arrivals.into_iter().peekable();

    println!("  time   limit  in flight  waiting");
    let sample_every = Duration::from_millis(250);
    let mut next_sample = t0;
    let mut now = t0;
    loop {
        // Jump to the next instant anything happens.
        let next_arrival = arrivals.peek().map(|&(at, _)| at);
        let next_finish = run.finishing.peek().map(|Reverse((at, _))| *at);
        let Some(next) = [next_arrival, next_finish, run.gate.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
        else {
            break;
        };
        while next_sample <= next {
            let stats = run.gate.stats();
            println!(
                "{:>6}  {:>6}  {:>9}  {:>7}",
                seconds(next_sample - t0),
                stats.limit,
                stats.in_flight,
                stats.pending
            );
            next_sample += sample_every;
        }
        now = now.max(next);
        while let Some(Reverse((at, id))) = run.finishing.peek().copied() {
            if at > now {
                break;
            }
            run.finishing.pop();
            let permit = run.permits.remove(&id).expect("running");
            run.gate.release(permit, now);
            run.drain(now);
        }
        while let Some((_, principal)) = arrivals.next_if(|&(at, _)| at <= now) {
            run.arrive(principal, now);
            run.drain(now);
        }
        run.drain(now);
    }

    let stats = run.gate.stats();
    let mut all: Vec<Duration> = run.waits.iter().map(|&(_, wait)| wait).collect();
    all.sort();
    println!();
    println!("admitted at once     {}", run.at_once);
    println!("admitted after wait  {}", run.waits.len() - run.at_once);
    println!("rejected (429)       {}", run.rejected);
    println!(
        "wait p50 / p99       {} / {}",
        seconds(percentile(&all, 0.50)),
        seconds(percentile(&all, 0.99))
    );
    for principal in [HEAVY, LIGHT] {
        let mut waits: Vec<Duration> = run
            .waits
            .iter()
            .filter(|&&(p, _)| p == principal)
            .map(|&(_, wait)| wait)
            .collect();
        waits.sort();
        println!(
            "  {principal:<18} {} claims, p50 {}, p99 {}",
            waits.len(),
            seconds(percentile(&waits, 0.50)),
            seconds(percentile(&waits, 0.99))
        );
    }
    println!("all done after       {}", seconds(now - t0));
    println!(
        "final limit          {} (latency average {})",
        stats.limit,
        stats.latency_average.map_or_else(
            || "none".to_owned(),
            |average| format!("{} ms", average.as_millis())
        )
    );
    Ok(())
}
