//! The dependency rules of ARCHITECTURE.md, checked against `cargo metadata`: which workspace
//! crate may depend on which (dependencies point one way: wire and domain types, then the
//! shared runtime and the SDK, then the services, then the tools), and which heavy native
//! crates stay where they belong (RocksDB in the shard, CUDA in the worker).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// A crate's layer; a crate may depend (normally or for its tests) on crates of lower layers
/// only, except where `ALSO` allows a crate of its own layer.
fn layer(name: &str) -> u32 {
    match name {
        "ps-proto" | "ps-codec" => 0,
        "ps-core" => 1,
        "ps-runtime" | "ps-client" => 2,
        "ps-launch" => 3,
        "ps-server" | "ps-scheduler" | "ps-worker" => 4,
        "ps-cli" | "ps-bench" => 5,
        "ps-tests" => 6,
        other => {
            panic!("`{other}` is not in the dependency rules: add it to ARCHITECTURE.md and here")
        }
    }
}

/// Dependencies within a layer that the rules allow.
const ALSO: &[(&str, &str)] = &[
    // The services' side of trace context keeps the SDK's span conventions
    // (`ps_client::trace`); the SDK never depends on the runtime.
    ("ps-runtime", "ps-client"),
];

struct Metadata {
    /// Workspace crate → its workspace dependencies (any kind), by name.
    workspace: BTreeMap<String, BTreeSet<String>>,
    /// Every package id → (name, the ids it depends on for normal builds).
    normal: BTreeMap<String, (String, Vec<String>)>,
    /// Workspace crate name → package id.
    ids: BTreeMap<String, String>,
}

fn metadata() -> Metadata {
    let triple = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--filter-platform",
        ])
        .arg(&triple)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let members: BTreeSet<&str> = m["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let mut workspace = BTreeMap::new();
    let mut ids = BTreeMap::new();
    let mut names = BTreeMap::new();
    for p in m["packages"].as_array().unwrap() {
        let id = p["id"].as_str().unwrap();
        let name = p["name"].as_str().unwrap().to_owned();
        names.insert(id.to_owned(), name.clone());
        if members.contains(id) {
            ids.insert(name.clone(), id.to_owned());
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["name"].as_str().unwrap().to_owned())
                .filter(|d| d.starts_with("ps-"))
                .collect();
            workspace.insert(name, deps);
        }
    }
    let mut normal = BTreeMap::new();
    for n in m["resolve"]["nodes"].as_array().unwrap() {
        let id = n["id"].as_str().unwrap().to_owned();
        let deps = n["deps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| {
                d["dep_kinds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|k| k["kind"].is_null())
            })
            .map(|d| d["pkg"].as_str().unwrap().to_owned())
            .collect();
        normal.insert(id.clone(), (names[&id].clone(), deps));
    }
    Metadata {
        workspace,
        normal,
        ids,
    }
}

impl Metadata {
    /// Every crate a normal build of `krate` compiles, by name.
    fn builds(&self, krate: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![self.ids[krate].clone()];
        let mut out = BTreeSet::new();
        while let Some(id) = todo.pop() {
            if !seen.insert(id.clone()) {
                continue;
            }
            let (name, deps) = &self.normal[&id];
            out.insert(name.clone());
            todo.extend(deps.iter().cloned());
        }
        out
    }
}

#[test]
fn dependencies_point_one_way() {
    let m = metadata();
    for (krate, deps) in &m.workspace {
        for dep in deps {
            let allowed =
                layer(dep) < layer(krate) || ALSO.contains(&(krate.as_str(), dep.as_str()));
            assert!(
                allowed,
                "`{krate}` (layer {}) depends on `{dep}` (layer {}): dependencies point down, \
                 a service never depends on another service or a tool (ARCHITECTURE.md)",
                layer(krate),
                layer(dep)
            );
        }
    }
}

#[test]
fn native_crates_stay_where_they_belong() {
    let m = metadata();
    for krate in m.workspace.keys() {
        let builds = m.builds(krate);
        let rocks = builds.contains("librocksdb-sys");
        let cuda = builds.contains("cudarc");
        let may_rocks = ["ps-server", "ps-bench", "ps-tests"].contains(&krate.as_str());
        let may_cuda = ["ps-worker", "ps-cli", "ps-tests"].contains(&krate.as_str());
        assert!(
            !rocks || may_rocks,
            "`{krate}` builds RocksDB; only the shard may"
        );
        assert!(
            !cuda || may_cuda,
            "`{krate}` builds cudarc; only the worker may"
        );
    }
    // And the two that must.
    assert!(m.builds("ps-server").contains("librocksdb-sys"));
    assert!(m.builds("ps-worker").contains("cudarc"));
}
