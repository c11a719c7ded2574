//! The embedded CPU trainer: a tiny decoder-only transformer (character vocabulary, learned
//! positions, pre-norm blocks of causal self-attention and an MLP) trained with candle, pure Rust.
//!
//! candle pitfalls this module avoids (measured in PROBES.md): the built-in LayerNorm/RmsNorm and
//! `softmax_last_dim` do not backpropagate, so layer norm is written from basic ops and softmax is
//! `candle_nn::ops::softmax`; candle's RNG cannot be seeded, so weights are initialised from our own
//! seeded RNG (bit-for-bit repeatable runs); jobs run single-threaded.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{D, DType, Device, Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand::{RngExt, SeedableRng, rngs::StdRng};
use serde::{Deserialize, Serialize};

use crate::model::data::{Row, Schedule};
use crate::util::error::{Error, IoContext, Result};
use rsim_kernels::{add_bias, add_bias_relu, layer_norm};

pub const MODEL_KIND: &str = "tiny-gpt";
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// Characters the model reads and writes; index 0 (newline) ends an answer and pads.
pub const VOCAB: &str = "\n0123456789+-=|,r ";

/// `config.json` of a tiny-gpt checkpoint (part of the hashed checkpoint).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GptConfig {
    pub model: String,
    pub vocab: String,
    pub d_model: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub context: usize,
    /// The checkpoint this one was trained from (none for a freshly initialised model).
    #[serde(default)]
    pub base: Option<String>,
}

impl GptConfig {
    pub fn small() -> Self {
        GptConfig {
            model: MODEL_KIND.into(),
            vocab: VOCAB.into(),
            d_model: 64,
            n_layers: 2,
            n_heads: 4,
            context: 48,
            base: None,
        }
    }
}

fn ce(e: candle_core::Error) -> Error {
    Error::internal(format!("candle: {e}"))
}

/// The model: named trainable tensors in a fixed order.
pub struct Gpt {
    pub config: GptConfig,
    names: Vec<String>,
    vars: HashMap<String, Var>,
    mask: Tensor,
    device: Device,
    /// Low-rank adapters while training with LoRA: weight name → (A [in, r], B [r, out]).
    lora: HashMap<String, (Var, Var)>,
    lora_scale: f64,
}

/// Each layer's keys and values `[B, H, len, hd]` of the positions run so far (`Gpt::run`).
#[derive(Default)]
struct KvCache {
    layers: Vec<(Tensor, Tensor)>,
    len: usize,
}

/// The weight matrices LoRA adapts (per layer).
const LORA_TARGETS: [&str; 4] = ["qkv_w", "proj_w", "fc_w", "out_w"];

fn param_shapes(c: &GptConfig) -> Vec<(String, Vec<usize>)> {
    let (d, v, t) = (c.d_model, c.vocab.chars().count(), c.context);
    let mut out = vec![
        ("tok_emb".to_string(), vec![v, d]),
        ("pos_emb".to_string(), vec![t, d]),
    ];
    for l in 0..c.n_layers {
        for (n, s) in [
            ("ln1_g", vec![d]),
            ("ln1_b", vec![d]),
            ("qkv_w", vec![d, 3 * d]),
            ("qkv_b", vec![3 * d]),
            ("proj_w", vec![d, d]),
            ("proj_b", vec![d]),
            ("ln2_g", vec![d]),
            ("ln2_b", vec![d]),
            ("fc_w", vec![d, 4 * d]),
            ("fc_b", vec![4 * d]),
            ("out_w", vec![4 * d, d]),
            ("out_b", vec![d]),
        ] {
            out.push((format!("h{l}.{n}"), s));
        }
    }
    out.push(("lnf_g".into(), vec![d]));
    out.push(("lnf_b".into(), vec![d]));
    out.push(("head_w".into(), vec![d, v]));
    out
}

impl Gpt {
    /// A freshly initialised model (weights ~ N(0, 0.02), gains 1, biases 0) from `seed`.
    pub fn init(config: GptConfig, seed: u64) -> Result<Gpt> {
        let device = Device::Cpu;
        let mut rng = StdRng::seed_from_u64(seed);
        let mut vars = HashMap::new();
        let mut names = Vec::new();
        for (name, shape) in param_shapes(&config) {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = if name.ends_with("_g") {
                vec![1.0; n]
            } else if name.ends_with("_b") {
                vec![0.0; n]
            } else {
                (0..n).map(|_| 0.02 * normal(&mut rng)).collect()
            };
            let t = Tensor::from_vec(data, shape.as_slice(), &device).map_err(ce)?;
            vars.insert(name.clone(), Var::from_tensor(&t).map_err(ce)?);
            names.push(name);
        }
        Self::assemble(config, names, vars, device)
    }

    fn assemble(
        config: GptConfig,
        names: Vec<String>,
        vars: HashMap<String, Var>,
        device: Device,
    ) -> Result<Gpt> {
        let t = config.context;
        let mask: Vec<f32> = (0..t * t)
            .map(|i| {
                if i % t > i / t {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let mask = Tensor::from_vec(mask, (t, t), &device).map_err(ce)?;
        Ok(Gpt {
            config,
            names,
            vars,
            mask,
            device,
            lora: HashMap::new(),
            lora_scale: 0.0,
        })
    }

    /// Load a checkpoint directory's files (`config.json`, `model.safetensors`).
    pub fn load(config_path: &Path, weights_path: &Path) -> Result<Gpt> {
        let config: GptConfig =
            serde_json::from_slice(&std::fs::read(config_path).at("cannot read", config_path)?)
                .map_err(|e| Error::invalid(format!("{}: {e}", config_path.display())))?;
        let device = Device::Cpu;
        let tensors = candle_core::safetensors::load(weights_path, &device).map_err(ce)?;
        let mut vars = HashMap::new();
        let mut names = Vec::new();
        for (name, shape) in param_shapes(&config) {
            let t = tensors.get(&name).ok_or_else(|| {
                Error::invalid(format!("{}: no tensor {name}", weights_path.display()))
            })?;
            if t.dims() != shape.as_slice() {
                return Err(Error::invalid(format!(
                    "{}: tensor {name} has shape {:?}, expected {shape:?}",
                    weights_path.display(),
                    t.dims()
                )));
            }
            vars.insert(
                name.clone(),
                Var::from_tensor(&t.to_dtype(DType::F32).map_err(ce)?).map_err(ce)?,
            );
            names.push(name);
        }
        Self::assemble(config, names, vars, device)
    }

    /// Write `config.json` and `model.safetensors` into `dir`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).at("cannot create", dir)?;
        let tensors: HashMap<String, Tensor> = self
            .names
            .iter()
            .map(|n| (n.clone(), self.vars[n].as_tensor().clone()))
            .collect();
        candle_core::safetensors::save(&tensors, dir.join(WEIGHTS_FILE)).map_err(ce)?;
        std::fs::write(
            dir.join(crate::model::paths::CHECKPOINT_CONFIG_FILE),
            crate::util::hash::json_bytes(&self.config)?,
        )
        .at("cannot write", dir)?;
        Ok(())
    }

    fn p(&self, name: &str) -> &Tensor {
        self.vars[name].as_tensor()
    }

    /// A weight as the forward pass sees it: with its low-rank update when LoRA is on.
    fn w(&self, name: &str) -> candle_core::Result<Tensor> {
        let base = self.p(name);
        match self.lora.get(name) {
            Some((a, b)) => base + (a.as_tensor().matmul(b.as_tensor())? * self.lora_scale)?,
            None => Ok(base.clone()),
        }
    }

    /// Every weight.
    pub fn vars(&self) -> Vec<Var> {
        self.names.iter().map(|n| self.vars[n].clone()).collect()
    }

    /// What the optimiser trains: the adapters under LoRA, else every weight.
    pub fn trainable_vars(&self) -> Vec<Var> {
        if self.lora.is_empty() {
            return self.vars();
        }
        let mut keys: Vec<&String> = self.lora.keys().collect();
        keys.sort();
        keys.into_iter()
            .flat_map(|k| {
                let (a, b) = &self.lora[k];
                [a.clone(), b.clone()]
            })
            .collect()
    }

    /// Freeze the weights and train rank-`rank` adapters on the attention and MLP matrices
    /// (A ~ N(0, 1/rank), B = 0, so training starts from the unchanged model; update scaled by
    /// alpha / rank).
    pub fn enable_lora(&mut self, rank: usize, alpha: f64, seed: u64) -> Result<()> {
        if rank == 0 {
            return Err(Error::invalid("adapter.rank: expected at least 1"));
        }
        let mut rng = StdRng::seed_from_u64(seed ^ 0x10a4);
        let std = (1.0 / rank as f64).sqrt() as f32;
        for l in 0..self.config.n_layers {
            for t in LORA_TARGETS {
                let name = format!("h{l}.{t}");
                let (din, dout) = self.p(&name).dims2().map_err(ce)?;
                let a: Vec<f32> = (0..din * rank).map(|_| std * normal(&mut rng)).collect();
                let a = Tensor::from_vec(a, (din, rank), &self.device).map_err(ce)?;
                let b = Tensor::zeros((rank, dout), DType::F32, &self.device).map_err(ce)?;
                self.lora.insert(
                    name,
                    (
                        Var::from_tensor(&a).map_err(ce)?,
                        Var::from_tensor(&b).map_err(ce)?,
                    ),
                );
            }
        }
        self.lora_scale = alpha / rank as f64;
        Ok(())
    }

    /// Fold the adapters into the weights (W + scale·A·B) so the checkpoint is a plain model.
    pub fn merge_lora(&mut self) -> Result<()> {
        let adapters = std::mem::take(&mut self.lora);
        for (name, (a, b)) in adapters {
            let delta =
                (a.as_tensor().matmul(b.as_tensor()).map_err(ce)? * self.lora_scale).map_err(ce)?;
            let merged = (self.p(&name) + delta).map_err(ce)?;
            self.vars[&name].set(&merged).map_err(ce)?;
        }
        Ok(())
    }

    /// Number of values the optimiser trains.
    pub fn trainable_count(&self) -> usize {
        self.trainable_vars()
            .iter()
            .map(|v| v.as_tensor().elem_count())
            .sum()
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        text.chars()
            .map(|c| {
                self.config
                    .vocab
                    .chars()
                    .position(|v| v == c)
                    .map(|i| i as u32)
                    .ok_or_else(|| {
                        Error::invalid(format!("character {c:?} is not in the model's vocabulary"))
                    })
            })
            .collect()
    }

    fn decode(&self, id: u32) -> char {
        self.config.vocab.chars().nth(id as usize).unwrap_or('\n')
    }

    /// Logits `[B, T, V]` for token ids `[B, T]`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.run(ids, None)
    }

    /// The forward pass over `ids` `[B, T]`, the positions after those `cache` holds (none
    /// without a cache). With a cache, each layer's keys and values of these positions are
    /// appended to it and attention spans every cached position, and only the last position's
    /// logits are computed (`[B, 1, V]`): generation runs the prompt once, then one token a step.
    fn run(&self, ids: &Tensor, mut cache: Option<&mut KvCache>) -> Result<Tensor> {
        let (b, t) = ids.dims2().map_err(ce)?;
        let start = cache.as_ref().map_or(0, |c| c.len);
        if start + t > self.config.context {
            return Err(Error::invalid(format!(
                "{} positions do not fit the model's context of {}",
                start + t,
                self.config.context
            )));
        }
        let d = self.config.d_model;
        let h = self.config.n_heads;
        let hd = d / h;
        let mut f = || -> candle_core::Result<Tensor> {
            let tok = self
                .p("tok_emb")
                .index_select(&ids.flatten_all()?, 0)?
                .reshape((b, t, d))?;
            // Positions by lookup, as tokens are: the embedding's gradient is then a scatter of
            // rows, not a sum over the batch of a broadcast.
            let positions: Vec<u32> = (0..b)
                .flat_map(|_| start as u32..(start + t) as u32)
                .collect();
            let positions = Tensor::from_vec(positions, b * t, ids.device())?;
            let pos = self.p("pos_emb").index_select(&positions, 0)?;
            // The residual stream as `[B·T, D]` rows: every projection is then one plain matmul
            // whose weight gradient is one matmul too (a batched `broadcast_matmul` made B small
            // ones and summed them over the batch), and every bias or norm gain broadcasts over
            // one leading dim only.
            let mut x = (tok.reshape((b * t, d))? + pos)?;
            // Causal: position start+i sees positions up to start+i (a single new position sees
            // everything cached, so it needs no mask).
            let mask = (t > 1)
                .then(|| self.mask.narrow(0, start, t)?.narrow(1, 0, start + t))
                .transpose()?;
            let scale = 1.0 / (hd as f64).sqrt();
            for l in 0..self.config.n_layers {
                let g = |n: &str| self.p(&format!("h{l}.{n}"));
                let a = layer_norm(&x, g("ln1_g"), g("ln1_b"))?;
                let qkv = add_bias(&a.matmul(&self.w(&format!("h{l}.qkv_w"))?)?, g("qkv_b"))?
                    .reshape((b, t, 3 * d))?;
                let split = |i: usize| -> candle_core::Result<Tensor> {
                    qkv.narrow(2, i * d, d)?
                        .reshape((b, t, h, hd))?
                        .transpose(1, 2)?
                        .contiguous()
                };
                let (q, mut k, mut v) = (split(0)?, split(1)?, split(2)?);
                if let Some(c) = cache.as_deref_mut() {
                    if let Some((ck, cv)) = c.layers.get(l) {
                        k = Tensor::cat(&[ck, &k], 2)?;
                        v = Tensor::cat(&[cv, &v], 2)?;
                    }
                    if l < c.layers.len() {
                        c.layers[l] = (k.clone(), v.clone());
                    } else {
                        c.layers.push((k.clone(), v.clone()));
                    }
                }
                let att = (q.matmul(&k.t()?.contiguous()?)? * scale)?;
                let att = match &mask {
                    Some(m) => att.broadcast_add(m)?,
                    None => att,
                };
                let att = candle_nn::ops::softmax(&att, D::Minus1)?;
                let y = att
                    .matmul(&v)?
                    .transpose(1, 2)?
                    .contiguous()?
                    .reshape((b * t, d))?;
                let y = add_bias(&y.matmul(&self.w(&format!("h{l}.proj_w"))?)?, g("proj_b"))?;
                x = (x + y)?;
                let m = layer_norm(&x, g("ln2_g"), g("ln2_b"))?;
                let m = add_bias_relu(&m.matmul(&self.w(&format!("h{l}.fc_w"))?)?, g("fc_b"))?;
                let m = add_bias(&m.matmul(&self.w(&format!("h{l}.out_w"))?)?, g("out_b"))?;
                x = (x + m)?;
            }
            let (x, t_out) = match cache.as_deref_mut() {
                Some(c) => {
                    c.len = start + t;
                    let last = x.reshape((b, t, d))?.narrow(1, t - 1, 1)?.reshape((b, d))?;
                    (last, 1)
                }
                None => (x, t),
            };
            let x = layer_norm(&x, self.p("lnf_g"), self.p("lnf_b"))?;
            let head = self.p("head_w");
            x.matmul(head)?.reshape((b, t_out, head.dim(1)?))
        };
        f().map_err(ce)
    }

    /// A training batch: ids, next-token targets, and the loss mask (answer tokens, or all).
    /// Rows are padded to the longest of the batch (or, for `pad_to_context`, to the whole
    /// context, which gives the same losses at a higher cost).
    fn batch(
        &self,
        rows: &[&Row],
        answer_only: bool,
        pad_to_context: bool,
    ) -> Result<(Tensor, Tensor, Tensor, f64)> {
        let context = self.config.context;
        let mut encoded = Vec::with_capacity(rows.len());
        for r in rows {
            // The row's training text (the one the contamination gate scans), then the end marker.
            let mut all = self.encode(&crate::model::data::training_text(r))?;
            let p = crate::model::data::prompt_chars(r);
            all.push(0);
            if all.len() > context + 1 {
                return Err(Error::invalid(format!(
                    "row {:?} is {} characters with its answer; the model's context is {context}",
                    r.prompt,
                    all.len() - 1
                )));
            }
            encoded.push((p, all));
        }
        // Pad to the longest row of the batch, not the whole context: causal attention keeps
        // padding from influencing earlier positions, and padded positions carry no loss.
        let longest = encoded.iter().map(|(_, a)| a.len() - 1).max().unwrap_or(1);
        let t = if pad_to_context {
            context
        } else {
            longest.max(1)
        };
        let (mut ids, mut tgt, mut mask) = (Vec::new(), Vec::new(), Vec::new());
        for (p, all) in &encoded {
            for i in 0..t {
                ids.push(*all.get(i).unwrap_or(&0));
                tgt.push(*all.get(i + 1).unwrap_or(&0));
                let in_row = i + 1 < all.len();
                let learn = in_row && (!answer_only || i + 1 >= *p);
                mask.push(if learn { 1f32 } else { 0.0 });
            }
        }
        let n = rows.len();
        let dev = &self.device;
        let learned = mask.iter().map(|m| f64::from(*m)).sum();
        Ok((
            Tensor::from_vec(ids, (n, t), dev).map_err(ce)?,
            Tensor::from_vec(tgt, n * t, dev).map_err(ce)?,
            Tensor::from_vec(mask, n * t, dev).map_err(ce)?,
            learned,
        ))
    }

    /// Mean cross-entropy over masked positions.
    pub fn loss(&self, rows: &[&Row], answer_only: bool) -> Result<Tensor> {
        self.loss_padded(rows, answer_only, false)
    }

    fn loss_padded(
        &self,
        rows: &[&Row],
        answer_only: bool,
        pad_to_context: bool,
    ) -> Result<Tensor> {
        let (ids, tgt, mask, learned) = self.batch(rows, answer_only, pad_to_context)?;
        self.loss_of(&ids, &tgt, &mask, learned)
    }

    /// The cross-entropy summed over a batch's masked positions, divided by `learned` (the
    /// batch's own count of them, or a whole batch's when this is one piece of it; at least 1).
    fn loss_of(&self, ids: &Tensor, tgt: &Tensor, mask: &Tensor, learned: f64) -> Result<Tensor> {
        let logits = self.forward(ids)?;
        let v = self.config.vocab.chars().count();
        let f = || -> candle_core::Result<Tensor> {
            let lsm = candle_nn::ops::log_softmax(&logits.reshape(((), v))?, D::Minus1)?;
            let picked = lsm.gather(&tgt.unsqueeze(1)?, 1)?.squeeze(1)?;
            let total = (picked * mask)?.sum_all()?;
            let count = Tensor::new(learned.max(1.0) as f32, &self.device)?;
            total.neg()?.div(&count)
        };
        f().map_err(ce)
    }

    /// The mean loss of `rows` and its gradients, computed in `shards` pieces of consecutive rows
    /// side by side (one thread each) and summed. Each piece's loss is divided by the whole
    /// batch's count of learned positions, so the sum is the whole batch's loss and gradient, to
    /// float rounding (a piece is padded to its own longest row, which changes no row's loss).
    /// The sums run in piece order, so the result depends on the pieces, never on the threads.
    pub fn sharded_grads(
        &self,
        rows: &[&Row],
        answer_only: bool,
        shards: usize,
    ) -> Result<(f64, candle_core::backprop::GradStore)> {
        let size = rows.len().div_ceil(shards.max(1)).max(1);
        let pieces = rows
            .chunks(size)
            .map(|p| self.batch(p, answer_only, false))
            .collect::<Result<Vec<_>>>()?;
        let learned: f64 = pieces.iter().map(|p| p.3).sum();
        let done = std::thread::scope(|s| {
            let running: Vec<_> = pieces
                .iter()
                .map(|(ids, tgt, mask, _)| {
                    s.spawn(move || -> Result<(f64, candle_core::backprop::GradStore)> {
                        let loss = self.loss_of(ids, tgt, mask, learned)?;
                        let grads = loss.backward().map_err(ce)?;
                        Ok((f64::from(loss.to_scalar::<f32>().map_err(ce)?), grads))
                    })
                })
                .collect();
            running
                .into_iter()
                .map(|h| {
                    h.join()
                        .map_err(|_| Error::internal("a training thread panicked"))?
                })
                .collect::<Result<Vec<_>>>()
        })?;
        let mut done = done.into_iter();
        let (mut loss, mut sum) = done
            .next()
            .ok_or_else(|| Error::invalid("no training rows"))?;
        let vars = self.trainable_vars();
        for (l, grads) in done {
            loss += l;
            for v in &vars {
                if let Some(g) = grads.get(v.as_tensor()) {
                    let total = match sum.remove(v.as_tensor()) {
                        Some(prev) => (prev + g).map_err(ce)?,
                        None => g.clone(),
                    };
                    sum.insert(v.as_tensor(), total);
                }
            }
        }
        Ok((loss, sum))
    }

    /// Greedy answers for prompts (batched by prompt length), each up to the end token. Each
    /// batch runs its prompts once and then one new token a step against a key/value cache
    /// (what recomputing the whole sequence every token gives, as a test checks).
    pub fn generate(&self, prompts: &[String]) -> Result<Vec<String>> {
        let mut out = vec![String::new(); prompts.len()];
        let mut groups: HashMap<usize, Vec<usize>> = HashMap::new();
        let encoded: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| self.encode(p))
            .collect::<Result<_>>()?;
        for (i, e) in encoded.iter().enumerate() {
            groups.entry(e.len()).or_default().push(i);
        }
        for (len, members) in groups {
            let prompt: Vec<u32> = members
                .iter()
                .flat_map(|&i| encoded[i].iter().copied())
                .collect();
            let mut ids =
                Tensor::from_vec(prompt, (members.len(), len), &self.device).map_err(ce)?;
            let mut cache = KvCache::default();
            let mut done = vec![false; members.len()];
            let mut cur = len;
            while cur < self.config.context && done.iter().any(|d| !d) {
                let logits = self.run(&ids, Some(&mut cache))?;
                let next: Vec<u32> = logits
                    .squeeze(1)
                    .and_then(|l| l.argmax(D::Minus1))
                    .and_then(|l| l.to_vec1())
                    .map_err(ce)?;
                for (k, &tok) in next.iter().enumerate() {
                    if !done[k] {
                        if tok == 0 {
                            done[k] = true;
                        } else {
                            out[members[k]].push(self.decode(tok));
                        }
                    }
                }
                ids = Tensor::from_vec(next, (members.len(), 1), &self.device).map_err(ce)?;
                cur += 1;
            }
        }
        Ok(out)
    }
}

fn normal(rng: &mut StdRng) -> f32 {
    let u1: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
    let u2: f64 = rng.random_range(0.0..1.0);
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

/// Learning rate at `step` (warmup, then the schedule).
pub fn lr_at(s: Schedule, base: f64, step: u64, steps: u64, warmup: u64) -> f64 {
    if step < warmup {
        return base * (step + 1) as f64 / warmup as f64;
    }
    let t = (step - warmup) as f64 / (steps.saturating_sub(warmup).max(1)) as f64;
    base * match s {
        Schedule::Constant => 1.0,
        Schedule::Linear => 1.0 - t,
        Schedule::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * t).cos()),
    }
}

/// One training step's progress: its loss, and whether it is one of the steps a curve reports
/// (every 50th and the last), with the mean of the last 20 steps' losses (one batch's loss is too
/// noisy for a curve).
pub struct Progress {
    pub step: u64,
    pub loss: f64,
    pub mean: f64,
    pub reported: bool,
}

/// Training progress and result.
pub struct TrainReport {
    pub final_loss: f64,
    pub steps: u64,
    pub tokens_per_s: f64,
    pub steps_per_s: f64,
}

/// The rows each training step takes, by index into `n` rows: `batch` drawn uniformly with
/// replacement from `seed`, step after step. `train` draws its batches here, so a benchmark can
/// hand another trainer exactly the batches this one trains on.
pub fn batch_order(seed: u64, n: usize, batch: usize) -> impl Iterator<Item = Vec<usize>> {
    let mut rng = StdRng::seed_from_u64(seed);
    std::iter::repeat_with(move || (0..batch).map(|_| rng.random_range(0..n.max(1))).collect())
}

/// Train in place on `rows`.
#[allow(clippy::too_many_arguments)]
pub fn train(
    model: &Gpt,
    rows: &[Row],
    lr: f64,
    schedule: Schedule,
    steps: u64,
    warmup: u64,
    batch: usize,
    shards: usize,
    answer_only: bool,
    seed: u64,
    mut progress: impl FnMut(&Progress),
    save_every: u64,
    mut save: impl FnMut(u64) -> Result<()>,
) -> Result<TrainReport> {
    if rows.is_empty() {
        return Err(Error::invalid("no training rows"));
    }
    let params = ParamsAdamW {
        lr,
        weight_decay: 0.0,
        ..ParamsAdamW::default()
    };
    let mut opt = AdamW::new(model.trainable_vars(), params).map_err(ce)?;
    let mut order = batch_order(seed, rows.len(), batch);
    let start = std::time::Instant::now();
    let mut recent = std::collections::VecDeque::new();
    // Real tokens (prompt, answer and end marker), not padding.
    let mut tokens = 0usize;
    for step in 0..steps {
        opt.set_learning_rate(lr_at(schedule, lr, step, steps, warmup));
        let picked: Vec<&Row> = order
            .next()
            .unwrap_or_default()
            .iter()
            .map(|&i| &rows[i])
            .collect();
        tokens += picked
            .iter()
            .map(|r| r.prompt.chars().count() + r.answer.chars().count() + 1)
            .sum::<usize>();
        let l = if shards <= 1 {
            let loss = model.loss(&picked, answer_only)?;
            opt.backward_step(&loss).map_err(ce)?;
            f64::from(loss.to_scalar::<f32>().map_err(ce)?)
        } else {
            let (loss, grads) = model.sharded_grads(&picked, answer_only, shards)?;
            opt.step(&grads).map_err(ce)?;
            loss
        };
        recent.push_back(l);
        if recent.len() > 20 {
            recent.pop_front();
        }
        progress(&Progress {
            step: step + 1,
            loss: l,
            mean: recent.iter().sum::<f64>() / recent.len() as f64,
            reported: (step + 1) % 50 == 0 || step + 1 == steps,
        });
        if save_every > 0 && (step + 1) % save_every == 0 && step + 1 < steps {
            save(step + 1)?;
        }
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    Ok(TrainReport {
        final_loss: recent.iter().sum::<f64>() / recent.len().max(1) as f64,
        steps,
        steps_per_s: steps as f64 / secs,
        tokens_per_s: tokens as f64 / secs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Vec<Row> {
        (0..20)
            .map(|i| Row {
                prompt: format!("{i}+1="),
                answer: (i + 1).to_string(),
            })
            .collect()
    }

    #[test]
    fn every_parameter_receives_a_gradient() {
        let m = Gpt::init(GptConfig::small(), 1).expect("init");
        let r = rows();
        let refs: Vec<&Row> = r.iter().collect();
        let loss = m.loss(&refs, true).expect("loss");
        let grads = loss.backward().expect("backward");
        for (name, var) in m.names.iter().map(|n| (n, &m.vars[n])) {
            let g = grads
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("no gradient for {name}"));
            let norm: f32 = g
                .sqr()
                .and_then(|x| x.sum_all())
                .and_then(|x| x.to_scalar())
                .expect("norm");
            assert!(norm > 0.0, "zero gradient for {name}");
        }
    }

    #[test]
    fn padding_a_batch_to_its_longest_row_changes_no_row_s_loss() {
        let m = Gpt::init(GptConfig::small(), 3).expect("init");
        let short = Row {
            prompt: "1+2=".into(),
            answer: "3".into(),
        };
        let long = Row {
            prompt: "123+456=".into(),
            answer: "6+3+0=9,5+2+0=7,4+1+0=5|579".into(),
        };
        let loss = |rows: &[&Row]| -> f64 {
            m.loss(rows, true)
                .and_then(|l| l.to_scalar::<f32>().map_err(ce))
                .expect("loss") as f64
        };
        // Answer-only loss: the answer's characters plus the end marker are the targets.
        let (ns, nl) = (2.0, 28.0);
        let together = loss(&[&short, &long]) * (ns + nl);
        let apart = loss(&[&short]) * ns + loss(&[&long]) * nl;
        assert!(
            (together - apart).abs() < 1e-4 * apart.abs().max(1.0),
            "a short row padded beside a long one scored differently: {together} vs {apart}"
        );
        assert_eq!(
            m.batch(&[&short], true, false).expect("batch").0.dims(),
            &[1, 5],
            "a lone short row is padded to its own length, not the context"
        );
    }

    #[test]
    fn padding_to_the_longest_row_computes_what_padding_to_the_context_did() {
        let m = Gpt::init(GptConfig::small(), 5).expect("init");
        let mut r = rows();
        r.push(Row {
            prompt: "905+87=".into(),
            answer: "5+7+0=2,0+8+1=9,9+0+0=9|992".into(),
        });
        let refs: Vec<&Row> = r.iter().collect();
        for answer_only in [true, false] {
            let short = m.loss_padded(&refs, answer_only, false).expect("loss");
            let full = m.loss_padded(&refs, answer_only, true).expect("loss");
            let (a, b) = (
                short.to_scalar::<f32>().expect("scalar"),
                full.to_scalar::<f32>().expect("scalar"),
            );
            assert!((a - b).abs() < 1e-5, "loss {a} vs {b}");
            let (ga, gb) = (
                short.backward().expect("backward"),
                full.backward().expect("backward"),
            );
            for name in ["tok_emb", "h0.qkv_w", "h1.fc_w", "head_w"] {
                let v = m.vars[name].as_tensor();
                let (x, y) = (
                    ga.get(v)
                        .expect("grad")
                        .flatten_all()
                        .and_then(|t| t.to_vec1::<f32>()),
                    gb.get(v)
                        .expect("grad")
                        .flatten_all()
                        .and_then(|t| t.to_vec1::<f32>()),
                );
                let (x, y) = (x.expect("grad"), y.expect("grad"));
                let worst = x
                    .iter()
                    .zip(&y)
                    .map(|(p, q)| (p - q).abs())
                    .fold(0f32, f32::max);
                assert!(worst < 1e-5, "{name}: gradients differ by {worst}");
            }
        }
    }

    #[test]
    fn a_batch_split_into_pieces_gives_the_whole_batch_s_loss_and_gradients() {
        let m = Gpt::init(GptConfig::small(), 5).expect("init");
        // Rows of different lengths, so the pieces pad differently from the whole batch.
        let mut r = rows();
        r.push(Row {
            prompt: "123+456=".into(),
            answer: "6+3+0=9,5+2+0=7,4+1+0=5|579".into(),
        });
        let refs: Vec<&Row> = r.iter().collect();
        let whole = m.loss(&refs, true).expect("loss");
        let gw = whole.backward().expect("backward");
        let whole = f64::from(whole.to_scalar::<f32>().expect("scalar"));
        for shards in [2, 3, 7] {
            let (loss, gs) = m.sharded_grads(&refs, true, shards).expect("pieces");
            assert!(
                (loss - whole).abs() < 1e-5,
                "{shards} pieces: loss {loss} vs {whole}"
            );
            for (name, var) in m.names.iter().map(|n| (n, &m.vars[n])) {
                let (a, b) = (
                    gw.get(var.as_tensor()).expect("grad"),
                    gs.get(var.as_tensor()).expect("grad"),
                );
                let worst = (a - b)
                    .and_then(|d| d.abs())
                    .and_then(|d| d.flatten_all())
                    .and_then(|d| d.max(0))
                    .and_then(|d| d.to_scalar::<f32>())
                    .expect("diff");
                assert!(worst < 1e-5, "{shards} pieces: {name} differs by {worst}");
            }
        }
    }

    #[test]
    fn lora_trains_only_the_adapters_and_merges_into_the_weights() {
        let r = rows();
        let refs: Vec<&Row> = r.iter().collect();
        let mut m = Gpt::init(GptConfig::small(), 7).expect("init");
        let flat = |m: &Gpt, n: &str| {
            m.p(n)
                .flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .expect("w")
        };
        let (emb, ln, qkv) = (
            flat(&m, "tok_emb"),
            flat(&m, "h0.ln1_g"),
            flat(&m, "h0.qkv_w"),
        );
        let total = m.trainable_count();
        m.enable_lora(4, 8.0, 1).expect("lora");
        let adapters = m.trainable_count();
        assert!(
            adapters * 4 < total,
            "{adapters} adapter values vs {total} weights"
        );
        let loss = |m: &Gpt| {
            m.loss(&refs, true)
                .and_then(|l| l.to_scalar::<f32>().map_err(ce))
                .expect("loss")
        };
        let before = loss(&m);
        train_briefly(&m, &r, 1e-2, 60);
        let trained = loss(&m);
        assert!(trained < before * 0.9, "loss {before} → {trained}");
        m.merge_lora().expect("merge");
        assert_eq!(m.trainable_count(), total, "adapters gone after the merge");
        // The merged model computes what the adapted one did; frozen weights did not move.
        assert!(
            (loss(&m) - trained).abs() < 1e-3,
            "{} vs {trained}",
            loss(&m)
        );
        assert_eq!(flat(&m, "tok_emb"), emb);
        assert_eq!(flat(&m, "h0.ln1_g"), ln);
        assert_ne!(flat(&m, "h0.qkv_w"), qkv);
    }

    /// `steps` steps of batch 8 at a constant `lr`, answer-only loss, seed 3, nothing kept.
    fn train_briefly(m: &Gpt, r: &[Row], lr: f64, steps: u64) {
        train(
            m,
            r,
            lr,
            Schedule::Constant,
            steps,
            0,
            8,
            1,
            true,
            3,
            |_| {},
            0,
            |_| Ok(()),
        )
        .expect("train");
    }

    /// Greedy decoding as it was before the key/value cache: the whole sequence run again for
    /// every token.
    fn generate_by_recomputing(m: &Gpt, prompt: &str) -> String {
        let mut seq = m.encode(prompt).expect("encode");
        let mut out = String::new();
        while seq.len() < m.config.context {
            let ids = Tensor::from_vec(seq.clone(), (1, seq.len()), &m.device).expect("ids");
            let logits = m.forward(&ids).expect("forward");
            let tok: u32 = logits
                .narrow(1, seq.len() - 1, 1)
                .and_then(|l| l.squeeze(1))
                .and_then(|l| l.argmax(D::Minus1))
                .and_then(|l| l.to_vec1::<u32>())
                .expect("argmax")[0];
            if tok == 0 {
                break;
            }
            out.push(m.decode(tok));
            seq.push(tok);
        }
        out
    }

    #[test]
    fn cached_generation_gives_what_recomputing_every_token_gives() {
        let m = Gpt::init(GptConfig::small(), 11).expect("init");
        let r = rows();
        train_briefly(&m, &r, 3e-3, 80);
        // Prompts of several lengths, batched together by length, some of them repeated.
        let prompts: Vec<String> = ["12+34=", "7+8=", "123+456=", "5+5=", "999+1=", "12+34="]
            .iter()
            .map(|p| p.to_string())
            .collect();
        let cached = m.generate(&prompts).expect("generate");
        let recomputed: Vec<String> = prompts
            .iter()
            .map(|p| generate_by_recomputing(&m, p))
            .collect();
        assert_eq!(cached, recomputed);
        assert!(cached.iter().any(|c| !c.is_empty()), "{cached:?}");
    }

    #[test]
    fn training_is_repeatable_and_lowers_the_loss() {
        let r = rows();
        let run = || {
            let m = Gpt::init(GptConfig::small(), 7).expect("init");
            let refs: Vec<&Row> = r.iter().collect();
            let before = m
                .loss(&refs, true)
                .and_then(|l| l.to_scalar::<f32>().map_err(ce))
                .expect("loss");
            train_briefly(&m, &r, 3e-3, 60);
            let after = m
                .loss(&refs, true)
                .and_then(|l| l.to_scalar::<f32>().map_err(ce))
                .expect("loss");
            (
                before,
                after,
                m.p("head_w")
                    .flatten_all()
                    .and_then(|t| t.to_vec1::<f32>())
                    .expect("w"),
            )
        };
        let (b1, a1, w1) = run();
        let (_, a2, w2) = run();
        assert!(a1 < b1 * 0.7, "loss {b1} → {a1}");
        assert_eq!(a1, a2);
        assert_eq!(w1, w2, "bit-for-bit repeatable");
    }
}
