//! `rsim bench --views N`: the size and time of every text view (dag text and DOT, report text
//! and HTML) on a deep chain and a wide DAG; `rsim bench --web N`: the scratch study behind the
//! web page served over a made-up DAG.

use std::path::Path;
use std::time::Instant;

use super::{Faces, bench_dir, bench_study, machine};
use crate::api::types::*;
use crate::model::Caller;
use crate::os::{Execute, Study};
use crate::util::error::Result;

/// One view of one DAG shape: its size and the time to produce it.
#[derive(Debug, serde::Serialize)]
pub struct ViewFigure {
    pub shape: &'static str,
    pub view: &'static str,
    pub nodes: usize,
    pub bytes: usize,
    pub bytes_per_node: f64,
    pub ms: f64,
}

/// `rsim bench --views N`: every text view of a chain N deep and of a DAG N wide (N children of
/// the root), built through branch actions by the campaign's own author (so the report shows
/// every node). Views must be linear in the DAG's size: bytes per node stay flat as N grows.
pub fn views(faces: Faces, n: usize, dir: Option<&Path>, json_out: bool) -> Result<String> {
    let mut txt = String::new();
    let base = bench_dir(dir)?;
    let author = Caller::new("orchestrator", crate::model::Role::Owner);
    let mut figures = Vec::new();
    for shape in ["chain", "wide"] {
        let root = base.join(shape);
        if root.exists() {
            std::fs::remove_dir_all(&root)?;
        }
        bench_study(&root, n + 10)?;
        let study = Study::open(&root)?;
        let t = Instant::now();
        let mut last = crate::model::ROOT_NODE.to_string();
        for i in 0..n {
            let parent = if shape == "chain" {
                last.clone()
            } else {
                crate::model::ROOT_NODE.to_string()
            };
            let r = study.branch(
                &author,
                BranchRequest {
                    parents: vec![parent],
                    title: format!("step {i}"),
                    hypothesis: String::new(),
                },
            )?;
            last = r.node;
        }
        eprintln!(
            "{shape}: built {n} nodes in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let nodes = n + 1;
        let mut time = |view: &'static str, f: &mut dyn FnMut() -> Result<usize>| -> Result<()> {
            let t = Instant::now();
            let bytes = f()?;
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            eprintln!("{shape} {view}: {bytes} bytes in {ms:.1} ms");
            figures.push(ViewFigure {
                shape,
                view,
                nodes,
                bytes,
                bytes_per_node: bytes as f64 / nodes as f64,
                ms,
            });
            Ok(())
        };
        time("dag text", &mut || Ok(study.dag_graph()?.to_text().len()))?;
        time("dag dot", &mut || Ok(study.dag_graph()?.to_dot(None).len()))?;
        time("report text", &mut || {
            let r = crate::campaign::report::build(&study, None)?;
            Ok(crate::campaign::report::text(&r).len())
        })?;
        time(
            "report html",
            &mut || Ok((faces.static_page)(&study)?.len()),
        )?;
    }
    if json_out {
        outln!(txt, "{}", serde_json::to_string_pretty(&figures)?);
    } else {
        outln!(txt, "machine: {}", machine());
        for f in &figures {
            outln!(
                txt,
                "{:<6} {:<12} {:>6} nodes  {:>10} bytes  {:>8.1} bytes/node  {:>9.1} ms",
                f.shape,
                f.view,
                f.nodes,
                f.bytes,
                f.bytes_per_node,
                f.ms
            );
        }
    }
    if dir.is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    Ok(txt)
}

/// `rsim bench --web N`: a scratch study for the web page over a made-up DAG, which `serve` (the
/// web face: the layout and everything after it run as for a real study) serves until
/// interrupted; the study is removed after.
pub fn web(dir: Option<&Path>, serve: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let root = bench_dir(dir)?.join("web");
    if root.exists() {
        std::fs::remove_dir_all(&root)?;
    }
    bench_study(&root, 10)?;
    let r = serve(&root);
    let _ = std::fs::remove_dir_all(&root);
    r
}
