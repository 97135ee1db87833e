//! cache-sim: hit ratios of cache policies for the shards' sparse-row cache, replayed on one
//! trace of sparse ids (Zipf over the key space, the distribution `ps-bench --store` pushes).
//! Compares the policy the shard uses (CLOCK, `ps-server/src/engine/rows.rs`) with LRU, S3-FIFO
//! and W-TinyLFU at cache sizes given as fractions of the key space, all on the same trace.
//!
//! ```text
//! cache-sim [--keys 10000000] [--accesses 30000000] [--zipf 1.05] [--sizes 0.001,0.01,0.1]
//! ```
//!
//! Prints one JSON object: for each size and policy, the hit ratio and the simulation's time
//! per access (single-threaded bookkeeping, not the shard's concurrent hit path).

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Instant;

use clap::Parser;
use rand::SeedableRng;
use rand_distr::{Distribution, Zipf};

#[derive(Parser)]
#[command(about = "Hit ratios of cache policies on a Zipf trace of sparse ids")]
struct Args {
    /// Distinct ids the trace draws from.
    #[arg(long, default_value_t = 10_000_000)]
    keys: u64,
    /// Accesses replayed (the first tenth warms the caches and is not counted).
    #[arg(long, default_value_t = 30_000_000)]
    accesses: usize,
    /// Zipf exponent.
    #[arg(long, default_value_t = 1.05)]
    zipf: f64,
    /// Cache sizes as fractions of `keys`.
    #[arg(long, value_delimiter = ',', default_value = "0.001,0.01,0.1")]
    sizes: Vec<f64>,
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

/// A cache of ids: `access` says whether the id was there (and admits it when it was not).
trait Policy {
    fn access(&mut self, key: u64) -> bool;
}

// ---------------------------------------------------------------------------------------------
// CLOCK: a ring of slots with a reference bit; a hit sets the bit, a miss advances the hand,
// clearing set bits, to the first clear one and replaces it (the shard's policy).

struct Clock {
    slots: Vec<(u64, bool)>,
    index: HashMap<u64, usize>,
    hand: usize,
    cap: usize,
}

impl Clock {
    fn new(cap: usize) -> Self {
        Self {
            slots: Vec::with_capacity(cap),
            index: HashMap::with_capacity(cap),
            hand: 0,
            cap,
        }
    }
}

impl Policy for Clock {
    fn access(&mut self, key: u64) -> bool {
        if let Some(&i) = self.index.get(&key) {
            self.slots[i].1 = true;
            return true;
        }
        if self.slots.len() < self.cap {
            self.index.insert(key, self.slots.len());
            self.slots.push((key, false));
            return false;
        }
        while self.slots[self.hand].1 {
            self.slots[self.hand].1 = false;
            self.hand = (self.hand + 1) % self.cap;
        }
        let old = self.slots[self.hand].0;
        self.index.remove(&old);
        self.slots[self.hand] = (key, false);
        self.index.insert(key, self.hand);
        self.hand = (self.hand + 1) % self.cap;
        false
    }
}

// ---------------------------------------------------------------------------------------------
// Doubly linked lists over one node arena, for LRU and W-TinyLFU's segments.

const NIL: usize = usize::MAX;

struct Node {
    key: u64,
    prev: usize,
    next: usize,
    list: u8,
}

#[derive(Clone, Copy)]
struct List {
    head: usize, // most recent
    tail: usize, // least recent
    len: usize,
}

impl List {
    const EMPTY: Self = Self {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

struct Arena {
    nodes: Vec<Node>,
    free: Vec<usize>,
    lists: [List; 3],
}

impl Arena {
    fn new() -> Self {
        Self {
            nodes: Vec::new(),
            free: Vec::new(),
            lists: [List::EMPTY; 3],
        }
    }

    fn push_front(&mut self, list: u8, key: u64) -> usize {
        let node = Node {
            key,
            prev: NIL,
            next: NIL,
            list,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i] = node;
                i
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        self.link_front(list, i);
        i
    }

    fn link_front(&mut self, list: u8, i: usize) {
        let l = &mut self.lists[list as usize];
        self.nodes[i].list = list;
        self.nodes[i].prev = NIL;
        self.nodes[i].next = l.head;
        if l.head != NIL {
            self.nodes[l.head].prev = i;
        } else {
            l.tail = i;
        }
        l.head = i;
        l.len += 1;
    }

    fn unlink(&mut self, i: usize) {
        let (prev, next, list) = (self.nodes[i].prev, self.nodes[i].next, self.nodes[i].list);
        let l = &mut self.lists[list as usize];
        if prev != NIL {
            self.nodes[prev].next = next;
        } else {
            l.head = next;
        }
        if next != NIL {
            self.nodes[next].prev = prev;
        } else {
            l.tail = prev;
        }
        l.len -= 1;
    }

    /// Moves node `i` to the front of `list`.
    fn move_front(&mut self, list: u8, i: usize) {
        self.unlink(i);
        self.link_front(list, i);
    }

    /// Removes the least recent node of `list`; its key.
    fn pop_back(&mut self, list: u8) -> Option<u64> {
        let i = self.lists[list as usize].tail;
        if i == NIL {
            return None;
        }
        self.unlink(i);
        self.free.push(i);
        Some(self.nodes[i].key)
    }

    fn len(&self, list: u8) -> usize {
        self.lists[list as usize].len
    }

    fn back(&self, list: u8) -> Option<usize> {
        let i = self.lists[list as usize].tail;
        (i != NIL).then_some(i)
    }
}

struct Lru {
    arena: Arena,
    index: HashMap<u64, usize>,
    cap: usize,
}

impl Policy for Lru {
    fn access(&mut self, key: u64) -> bool {
        if let Some(&i) = self.index.get(&key) {
            self.arena.move_front(0, i);
            return true;
        }
        if self.arena.len(0) >= self.cap
            && let Some(old) = self.arena.pop_back(0)
        {
            self.index.remove(&old);
        }
        let i = self.arena.push_front(0, key);
        self.index.insert(key, i);
        false
    }
}

// ---------------------------------------------------------------------------------------------
// S3-FIFO (Yang et al., SOSP 2023): a small FIFO (10%) that new ids enter, a main FIFO (90%),
// and a ghost FIFO of ids recently dropped from the small one. An id hit while in the small
// FIFO moves to the main one when it reaches its end; the main FIFO gives an id with hits
// another round (its count decremented) instead of evicting it; an id in the ghost enters main.

struct S3Fifo {
    small: VecDeque<u64>,
    main: VecDeque<u64>,
    ghost: VecDeque<u64>,
    ghost_set: HashSet<u64>,
    /// Cached ids: hit count (0..=3) and whether in main.
    meta: HashMap<u64, (u8, bool)>,
    small_cap: usize,
    main_cap: usize,
}

impl S3Fifo {
    fn new(cap: usize) -> Self {
        let small_cap = (cap / 10).max(1);
        Self {
            small: VecDeque::new(),
            main: VecDeque::new(),
            ghost: VecDeque::new(),
            ghost_set: HashSet::new(),
            meta: HashMap::with_capacity(cap),
            small_cap,
            main_cap: cap - small_cap,
        }
    }

    fn evict_main(&mut self) {
        while let Some(k) = self.main.pop_front() {
            let Some(m) = self.meta.get_mut(&k) else {
                continue;
            };
            if m.0 > 0 {
                m.0 -= 1;
                self.main.push_back(k);
            } else {
                self.meta.remove(&k);
                return;
            }
        }
    }

    fn evict_small(&mut self) {
        while let Some(k) = self.small.pop_front() {
            let Some(m) = self.meta.get_mut(&k) else {
                continue;
            };
            if m.0 > 0 {
                *m = (0, true);
                self.main.push_back(k);
                if self.main.len() > self.main_cap {
                    self.evict_main();
                }
            } else {
                self.meta.remove(&k);
                self.ghost.push_back(k);
                self.ghost_set.insert(k);
                if self.ghost.len() > self.main_cap
                    && let Some(g) = self.ghost.pop_front()
                {
                    self.ghost_set.remove(&g);
                }
                return;
            }
        }
    }
}

impl Policy for S3Fifo {
    fn access(&mut self, key: u64) -> bool {
        if let Some(m) = self.meta.get_mut(&key) {
            m.0 = (m.0 + 1).min(3);
            return true;
        }
        if self.ghost_set.remove(&key) {
            self.meta.insert(key, (0, true));
            self.main.push_back(key);
            if self.main.len() > self.main_cap {
                self.evict_main();
            }
        } else {
            if self.small.len() >= self.small_cap {
                self.evict_small();
            }
            self.meta.insert(key, (0, false));
            self.small.push_back(key);
        }
        false
    }
}

// ---------------------------------------------------------------------------------------------
// W-TinyLFU (Einziger et al., 2017): a 1% LRU window new ids enter; the window's victim enters
// the main segmented LRU (20% probation, 80% protected) only if a count-min sketch of recent
// accesses says it is more frequent than the probation victim it would replace. Sketch: 4 rows
// of 4-bit-like counters (saturating at 15), halved every 10 × capacity accesses.

struct Sketch {
    rows: Vec<Vec<u8>>,
    mask: u64,
    added: usize,
    reset_at: usize,
}

impl Sketch {
    fn new(cap: usize) -> Self {
        let width = (cap * 2).next_power_of_two().max(64);
        Self {
            rows: vec![vec![0; width]; 4],
            mask: width as u64 - 1,
            added: 0,
            reset_at: 10 * cap,
        }
    }

    fn slot(key: u64, row: usize, mask: u64) -> usize {
        let mut z = key ^ (0x9e37_79b9_7f4a_7c15u64.wrapping_mul(row as u64 + 1));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) & mask) as usize
    }

    fn add(&mut self, key: u64) {
        for r in 0..4 {
            let s = Self::slot(key, r, self.mask);
            self.rows[r][s] = (self.rows[r][s] + 1).min(15);
        }
        self.added += 1;
        if self.added >= self.reset_at {
            self.added = 0;
            for row in &mut self.rows {
                for c in row.iter_mut() {
                    *c >>= 1;
                }
            }
        }
    }

    fn estimate(&self, key: u64) -> u8 {
        (0..4)
            .map(|r| self.rows[r][Self::slot(key, r, self.mask)])
            .min()
            .unwrap_or(0)
    }
}

const WINDOW: u8 = 0;
const PROBATION: u8 = 1;
const PROTECTED: u8 = 2;

struct WTinyLfu {
    arena: Arena,
    index: HashMap<u64, usize>,
    sketch: Sketch,
    window_cap: usize,
    probation_cap: usize,
    protected_cap: usize,
}

impl WTinyLfu {
    fn new(cap: usize) -> Self {
        let window_cap = (cap / 100).max(1);
        let main = cap - window_cap;
        let protected_cap = main * 8 / 10;
        Self {
            arena: Arena::new(),
            index: HashMap::with_capacity(cap),
            sketch: Sketch::new(cap),
            window_cap,
            probation_cap: main - protected_cap,
            protected_cap,
        }
    }
}

impl Policy for WTinyLfu {
    fn access(&mut self, key: u64) -> bool {
        self.sketch.add(key);
        if let Some(&i) = self.index.get(&key) {
            match self.arena.nodes[i].list {
                PROBATION => {
                    self.arena.move_front(PROTECTED, i);
                    if self.arena.len(PROTECTED) > self.protected_cap
                        && let Some(d) = self.arena.back(PROTECTED)
                    {
                        self.arena.move_front(PROBATION, d);
                    }
                }
                l => self.arena.move_front(l, i),
            }
            return true;
        }
        let i = self.arena.push_front(WINDOW, key);
        self.index.insert(key, i);
        if self.arena.len(WINDOW) > self.window_cap
            && let Some(cand) = self.arena.pop_back(WINDOW)
        {
            self.index.remove(&cand);
            let main_len = self.arena.len(PROBATION) + self.arena.len(PROTECTED);
            if main_len < self.probation_cap + self.protected_cap {
                let j = self.arena.push_front(PROBATION, cand);
                self.index.insert(cand, j);
            } else if let Some(v) = self.arena.back(PROBATION) {
                let victim = self.arena.nodes[v].key;
                if self.sketch.estimate(cand) > self.sketch.estimate(victim) {
                    self.arena.pop_back(PROBATION);
                    self.index.remove(&victim);
                    let j = self.arena.push_front(PROBATION, cand);
                    self.index.insert(cand, j);
                }
            }
        }
        false
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.keys >= 1000, "--keys: at least 1000");
    let zipf = Zipf::new(args.keys as f64, args.zipf)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    // Ranks scrambled so that hot ids are not small integers next to each other.
    let trace: Vec<u64> = (0..args.accesses)
        .map(|_| (zipf.sample(&mut rng) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    let warm = args.accesses / 10;
    let mut results = Vec::new();
    for &frac in &args.sizes {
        let cap = ((args.keys as f64 * frac) as usize).max(10);
        let policies: Vec<(&str, Box<dyn Policy>)> = vec![
            ("clock", Box::new(Clock::new(cap))),
            (
                "lru",
                Box::new(Lru {
                    arena: Arena::new(),
                    index: HashMap::with_capacity(cap),
                    cap,
                }),
            ),
            ("s3-fifo", Box::new(S3Fifo::new(cap))),
            ("w-tinylfu", Box::new(WTinyLfu::new(cap))),
        ];
        for (name, mut p) in policies {
            let start = Instant::now();
            let mut hits = 0u64;
            for (n, &k) in trace.iter().enumerate() {
                let hit = p.access(k);
                if n >= warm && hit {
                    hits += 1;
                }
            }
            let took = start.elapsed();
            let ratio = hits as f64 / (args.accesses - warm) as f64;
            eprintln!("size {frac} ({cap} rows) {name:<10} hit ratio {ratio:.4}");
            results.push(serde_json::json!({
                "size_fraction": frac, "rows": cap, "policy": name,
                "hit_ratio": ratio,
                "ns_per_access": took.as_nanos() as f64 / args.accesses as f64,
            }));
        }
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({
            "keys": args.keys, "accesses": args.accesses, "zipf": args.zipf,
            "results": results,
        }))?
    );
    Ok(())
}
