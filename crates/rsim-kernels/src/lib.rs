//! Fused CPU kernels for the embedded trainer, as candle custom ops with hand-written backward
//! passes: layer norm with its gain and bias, a bias added to every row, and a bias then a ReLU. Written from candle's
//! basic ops, each was a chain of graph nodes over `[N, D]` rows, and candle's backward pays for
//! every node (a gradient tensor of zeros, then an add, per input), which took a fifth of a training
//! step (perf, `rsim job step-bench`). Fused, each is one node: one pass forward, one pass back.
//! Tests check values and gradients against the composite ops they replace. A crate of its own so
//! that debug builds compile these loops optimised, as they do candle (the root Cargo.toml).

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Shape, Storage, Tensor};

type CResult<T> = candle_core::Result<T>;

fn err(msg: impl Into<String>) -> candle_core::Error {
    candle_core::Error::Msg(msg.into())
}

/// The f32 data of a contiguous CPU storage under its layout.
fn data<'a>(s: &'a CpuStorage, l: &Layout) -> CResult<&'a [f32]> {
    let CpuStorage::F32(v) = s else {
        return Err(err("fused op: f32 tensors only"));
    };
    let (a, b) = l
        .contiguous_offsets()
        .ok_or_else(|| err("fused op: a contiguous input is required"))?;
    Ok(&v[a..b])
}

/// Rows and width of a `[N, D]` layout.
fn dims(l: &Layout) -> CResult<(usize, usize)> {
    match l.shape().dims() {
        [n, d] => Ok((*n, *d)),
        other => Err(err(format!("fused op: [N, D] expected, got {other:?}"))),
    }
}

/// Run `f` on the f32 data of a (contiguous) tensor.
fn with_data<T>(t: &Tensor, f: impl FnOnce(&[f32]) -> CResult<T>) -> CResult<T> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(s) => f(data(s, layout)?),
        _ => Err(err("fused op: CPU tensors only")),
    }
}

/// `(x − mean) / sqrt(var + eps) · g + b` over the last dim of `x` `[N, D]`, `g` and `b` `[D]`
/// (the biased variance, as `torch.nn.functional.layer_norm`).
pub fn layer_norm(x: &Tensor, g: &Tensor, b: &Tensor) -> CResult<Tensor> {
    x.contiguous()?
        .apply_op3(&g.contiguous()?, &b.contiguous()?, LayerNorm { eps: 1e-5 })
}

/// `x` `[N, D]` plus `b` `[D]` on every row.
pub fn add_bias(x: &Tensor, b: &Tensor) -> CResult<Tensor> {
    x.contiguous()?
        .apply_op2(&b.contiguous()?, AddBias { relu: false })
}

/// `relu(x + b)`, `b` on every row of `x` (the MLP's first layer): one node, where a bias then a
/// ReLU were two and the ReLU's backward built a mask by comparison.
pub fn add_bias_relu(x: &Tensor, b: &Tensor) -> CResult<Tensor> {
    x.contiguous()?
        .apply_op2(&b.contiguous()?, AddBias { relu: true })
}

struct LayerNorm {
    eps: f32,
}

/// Each row's mean and 1/sqrt(var + eps).
fn row_stats(row: &[f32], eps: f32) -> (f32, f32) {
    let d = row.len() as f32;
    let mean = row.iter().sum::<f32>() / d;
    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d;
    (mean, 1.0 / (var + eps).sqrt())
}

impl CustomOp3 for LayerNorm {
    fn name(&self) -> &'static str {
        "rsim-layer-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> CResult<(CpuStorage, Shape)> {
        let (n, d) = dims(l1)?;
        let (x, g, b) = (data(s1, l1)?, data(s2, l2)?, data(s3, l3)?);
        if g.len() != d || b.len() != d {
            return Err(err("layer norm: gain and bias must have the rows' width"));
        }
        let mut y = vec![0f32; n * d];
        for (xr, yr) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)) {
            let (mean, rstd) = row_stats(xr, self.eps);
            for i in 0..d {
                yr[i] = (xr[i] - mean) * rstd * g[i] + b[i];
            }
        }
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        g: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> CResult<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (n, d) = x.dims2()?;
        let (mut dx, mut dg, mut db) = (vec![0f32; n * d], vec![0f32; d], vec![0f32; d]);
        with_data(x, |x| {
            with_data(g, |g| {
                with_data(grad, |dy| {
                    let mut xhat = vec![0f32; d];
                    let rows = x.chunks_exact(d).zip(dy.chunks_exact(d));
                    for ((xr, dyr), dxr) in rows.zip(dx.chunks_exact_mut(d)) {
                        let (mean, rstd) = row_stats(xr, self.eps);
                        let (mut sum_dxhat, mut sum_dxhat_xhat) = (0f32, 0f32);
                        for i in 0..d {
                            xhat[i] = (xr[i] - mean) * rstd;
                            dg[i] += dyr[i] * xhat[i];
                            db[i] += dyr[i];
                            let dxhat = dyr[i] * g[i];
                            sum_dxhat += dxhat;
                            sum_dxhat_xhat += dxhat * xhat[i];
                        }
                        let (m1, m2) = (sum_dxhat / d as f32, sum_dxhat_xhat / d as f32);
                        for i in 0..d {
                            dxr[i] = rstd * (dyr[i] * g[i] - m1 - xhat[i] * m2);
                        }
                    }
                    Ok(())
                })
            })
        })?;
        let dev = x.device();
        Ok((
            Some(Tensor::from_vec(dx, (n, d), dev)?),
            Some(Tensor::from_vec(dg, d, dev)?),
            Some(Tensor::from_vec(db, d, dev)?),
        ))
    }
}

struct AddBias {
    relu: bool,
}

impl CustomOp2 for AddBias {
    fn name(&self) -> &'static str {
        if self.relu {
            "rsim-add-bias-relu"
        } else {
            "rsim-add-bias"
        }
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> CResult<(CpuStorage, Shape)> {
        let (n, d) = dims(l1)?;
        let (x, b) = (data(s1, l1)?, data(s2, l2)?);
        if b.len() != d {
            return Err(err("bias: must have the rows' width"));
        }
        let mut y = Vec::with_capacity(n * d);
        for xr in x.chunks_exact(d) {
            if self.relu {
                y.extend(xr.iter().zip(b).map(|(x, b)| (x + b).max(0.0)));
            } else {
                y.extend(xr.iter().zip(b).map(|(x, b)| x + b));
            }
        }
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        _b: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> CResult<(Option<Tensor>, Option<Tensor>)> {
        let (n, d) = x.dims2()?;
        // Through the ReLU, the gradient passes where the output is positive (as candle's relu).
        let dx = if self.relu {
            let dx = with_data(res, |y| {
                with_data(grad, |dy| {
                    Ok(y.iter()
                        .zip(dy)
                        .map(|(y, g)| if *y > 0.0 { *g } else { 0.0 })
                        .collect::<Vec<f32>>())
                })
            })?;
            Tensor::from_vec(dx, (n, d), x.device())?
        } else {
            grad.clone()
        };
        let db = with_data(&dx, |dy| {
            let mut db = vec![0f32; d];
            for r in dy.chunks_exact(d) {
                for (s, v) in db.iter_mut().zip(r) {
                    *s += v;
                }
            }
            Ok(db)
        })?;
        Ok((Some(dx), Some(Tensor::from_vec(db, d, x.device())?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{D, Device, Var};

    fn var(shape: &[usize], seed: u32) -> Var {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| ((i as f32 * 0.37 + seed as f32).sin() * 1.7) + 0.1 * seed as f32)
            .collect();
        Var::from_tensor(&Tensor::from_vec(v, shape, &Device::Cpu).unwrap()).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    /// The composite ops these kernels replace (what the trainer computed before).
    fn composite_layer_norm(x: &Tensor, g: &Tensor, b: &Tensor) -> Tensor {
        let mean = x.mean_keepdim(D::Minus1).unwrap();
        let xc = x.broadcast_sub(&mean).unwrap();
        let var = xc.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
        xc.broadcast_div(&(var + 1e-5).unwrap().sqrt().unwrap())
            .unwrap()
            .broadcast_mul(g)
            .unwrap()
            .broadcast_add(b)
            .unwrap()
    }

    /// The fused op's values, and its gradients of a weighted sum of the outputs, match the
    /// composite ops' within `tol` for every input; the fused gradients.
    fn same_as_composite(
        what: &str,
        fused: Tensor,
        composite: Tensor,
        inputs: &[(&str, &Var)],
        tol: f32,
    ) -> candle_core::backprop::GradStore {
        let d = max_diff(&fused, &composite);
        assert!(d < tol, "{what}: values differ by {d}");
        // A weighting of the outputs, so each output position's gradient differs.
        let w = var(fused.dims(), 4).as_tensor().clone();
        let grads = |t: Tensor| (t * &w).unwrap().sum_all().unwrap().backward().unwrap();
        let (gf, gc) = (grads(fused), grads(composite));
        for (name, v) in inputs {
            let d = max_diff(gf.get(v).unwrap(), gc.get(v).unwrap());
            assert!(d < tol, "{what}: d{name} differs by {d}");
        }
        gf
    }

    #[test]
    fn fused_ops_compute_and_differentiate_what_the_composite_ops_do() {
        let (x, g, b) = (var(&[7, 12], 1), var(&[12], 2), var(&[12], 3));
        same_as_composite(
            "layer norm",
            layer_norm(&x, &g, &b).unwrap(),
            composite_layer_norm(&x, &g, &b),
            &[("x", &x), ("g", &g), ("b", &b)],
            1e-4,
        );
        same_as_composite(
            "bias",
            add_bias(&x, &b).unwrap(),
            x.broadcast_add(&b).unwrap(),
            &[("x", &x), ("b", &b)],
            1e-5,
        );
        // x has entries on both sides of -b, so the ReLU passes some gradients and stops others.
        let gf = same_as_composite(
            "bias and relu",
            add_bias_relu(&x, &b).unwrap(),
            x.broadcast_add(&b).unwrap().relu().unwrap(),
            &[("x", &x), ("b", &b)],
            1e-5,
        );
        let stopped = gf.get(&x).unwrap().eq(0f32).unwrap();
        let stopped = stopped.to_dtype(candle_core::DType::F32).unwrap();
        assert!(
            stopped.sum_all().unwrap().to_scalar::<f32>().unwrap() > 0.0,
            "the ReLU stopped no gradient"
        );
    }

    #[test]
    fn fused_ops_refuse_mismatched_widths() {
        let (x, g) = (var(&[3, 4], 1), var(&[5], 2));
        assert!(layer_norm(&x, &g, &g).is_err());
        assert!(add_bias(&x, &g).is_err());
        assert!(add_bias_relu(&x, &g).is_err());
    }
}
