//! The per-tensor update kernels of the seven rules (Caffe's `ComputeUpdateValue` plus
//! `Regularize` plus `Net::Update`, fused into one pass over the flat slices).
//!
//! Each kernel walks one tensor's slices once. Per element it forms the effective gradient
//! `g = scale · diff + decay · r(w)` (normalisation and clipping folded into `scale`; `r(w) = w`
//! for L2, `sign(w)` for L1), stores it back into `diff`, updates the history and the weight. The
//! loops are plain zips over equal-length slices, without bounds checks or branches the compiler
//! cannot turn into selects, so they vectorise; nothing is allocated.

/// The scalars shared by every element of one tensor in one step.
#[derive(Debug, Clone, Copy)]
pub(super) struct Coeffs {
    /// Multiplies the raw diff: `1 / iter_size`, times the clipping factor when clipping is on.
    pub scale: f32,
    /// `weight_decay · decay_mult`.
    pub decay: f32,
    /// `lr · lr_mult`.
    pub lr: f32,
}

impl Coeffs {
    /// The effective gradient of one element: `scale · d + decay · r(w)`.
    #[inline(always)]
    fn grad<const L1: bool>(&self, d: f32, w: f32) -> f32 {
        let r = if L1 { sign(w) } else { w };
        self.scale * d + self.decay * r
    }
}

/// Caffe's `caffe_sign`: −1, 0 or 1 (0 for ±0, unlike `f32::signum`).
#[inline(always)]
fn sign(x: f32) -> f32 {
    ((x > 0.0) as i32 - (x < 0.0) as i32) as f32
}

fn check(w: &[f32], g: &[f32], h: &[f32]) {
    assert!(
        w.len() == g.len() && g.len() == h.len(),
        "update: data {}, diff {} and history {} lengths differ",
        w.len(),
        g.len(),
        h.len()
    );
}

/// Runs `f(grad, w, h)` at each index of a parameter `w`, its gradient `g` and its history `h`
/// (all of one length), with `grad` the element's effective gradient, stored into `g` first.
#[inline(always)]
fn each_with_history<const L1: bool>(
    c: Coeffs,
    w: &mut [f32],
    g: &mut [f32],
    h: &mut [f32],
    mut f: impl FnMut(f32, &mut f32, &mut f32),
) {
    check(w, g, h);
    for ((wi, gi), hi) in w.iter_mut().zip(g.iter_mut()).zip(h.iter_mut()) {
        let grad = c.grad::<L1>(*gi, *wi);
        *gi = grad;
        f(grad, wi, hi);
    }
}

/// SGD with momentum `m`: `v ← m·v + lr·g`, `w ← w − v`.
pub(super) fn sgd<const L1: bool>(c: Coeffs, m: f32, w: &mut [f32], g: &mut [f32], v: &mut [f32]) {
    each_with_history::<L1>(c, w, g, v, |grad, wi, vi| {
        *vi = m * *vi + c.lr * grad;
        *wi -= *vi;
    });
}

/// Nesterov momentum: `v' ← m·v + lr·g`, `w ← w − ((1 + m)·v' − m·v)`.
pub(super) fn nesterov<const L1: bool>(
    c: Coeffs,
    m: f32,
    w: &mut [f32],
    g: &mut [f32],
    v: &mut [f32],
) {
    each_with_history::<L1>(c, w, g, v, |grad, wi, vi| {
        let prev = *vi;
        let next = m * prev + c.lr * grad;
        *vi = next;
        *wi -= (1.0 + m) * next - m * prev;
    });
}

/// AdaGrad: `h ← h + g²`, `w ← w − lr·g / (√h + δ)`.
pub(super) fn adagrad<const L1: bool>(
    c: Coeffs,
    delta: f32,
    w: &mut [f32],
    g: &mut [f32],
    h: &mut [f32],
) {
    each_with_history::<L1>(c, w, g, h, |grad, wi, hi| {
        *hi += grad * grad;
        *wi -= c.lr * grad / (hi.sqrt() + delta);
    });
}

/// RMSProp with decay `ρ`: `h ← ρ·h + (1 − ρ)·g²`, `w ← w − lr·g / (√h + δ)`.
pub(super) fn rmsprop<const L1: bool>(
    c: Coeffs,
    rho: f32,
    delta: f32,
    w: &mut [f32],
    g: &mut [f32],
    h: &mut [f32],
) {
    each_with_history::<L1>(c, w, g, h, |grad, wi, hi| {
        *hi = rho * *hi + (1.0 - rho) * grad * grad;
        *wi -= c.lr * grad / (hi.sqrt() + delta);
    });
}

/// Adam's hyper-parameters for one step.
#[derive(Debug, Clone, Copy)]
pub(super) struct AdamStep {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// `√(1 − β₂ᵗ) / (1 − β₁ᵗ)`.
    pub correction: f32,
}

impl AdamStep {
    /// Moves the moments `m`, `v` by `grad`.
    #[inline(always)]
    fn moments(&self, grad: f32, m: &mut f32, v: &mut f32) {
        *m = self.beta1 * *m + (1.0 - self.beta1) * grad;
        *v = self.beta2 * *v + (1.0 - self.beta2) * grad * grad;
    }
}

/// Runs `f` on the elements at each index of a parameter `w`, its gradient `g` and its two
/// history tensors `a` and `b` (all of one length).
#[inline(always)]
fn each_with_two_histories(
    w: &mut [f32],
    g: &mut [f32],
    a: &mut [f32],
    b: &mut [f32],
    mut f: impl FnMut(&mut f32, &mut f32, &mut f32, &mut f32),
) {
    check(w, g, a);
    check(w, g, b);
    for (((wi, gi), ai), bi) in w
        .iter_mut()
        .zip(g.iter_mut())
        .zip(a.iter_mut())
        .zip(b.iter_mut())
    {
        f(wi, gi, ai, bi);
    }
}

/// Adam as in Caffe: `m ← β₁·m + (1 − β₁)·g`, `v ← β₂·v + (1 − β₂)·g²`,
/// `w ← w − lr·correction·m / (√v + ε)`.
pub(super) fn adam<const L1: bool>(
    c: Coeffs,
    a: AdamStep,
    w: &mut [f32],
    g: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
) {
    let step = c.lr * a.correction;
    each_with_two_histories(w, g, m, v, |wi, gi, mi, vi| {
        let grad = c.grad::<L1>(*gi, *wi);
        *gi = grad;
        a.moments(grad, mi, vi);
        *wi -= step * *mi / (vi.sqrt() + a.eps);
    });
}

/// AdaDelta as in Caffe, with decay `ρ` (`momentum`): `h ← ρ·h + (1 − ρ)·g²`,
/// `s = g·√(u + δ) / √(h + δ)`, `u ← ρ·u + (1 − ρ)·s²`, `w ← w − lr·s`.
pub(super) fn adadelta<const L1: bool>(
    c: Coeffs,
    rho: f32,
    delta: f32,
    w: &mut [f32],
    g: &mut [f32],
    h: &mut [f32],
    u: &mut [f32],
) {
    each_with_two_histories(w, g, h, u, |wi, gi, hi, ui| {
        let grad = c.grad::<L1>(*gi, *wi);
        *gi = grad;
        *hi = rho * *hi + (1.0 - rho) * grad * grad;
        let step = grad * (*ui + delta).sqrt() / (*hi + delta).sqrt();
        *ui = rho * *ui + (1.0 - rho) * step * step;
        *wi -= c.lr * step;
    });
}

/// AdamW, Adam with the weight decay decoupled from the gradient (PyTorch's `AdamW`): the
/// moments see `g = scale · diff` only, and `w ← w − lr·decay·r(w) − lr·correction·m / (√v + ε)`
/// with `r(w) = w` (L2) or `sign(w)` (L1), `w` taken before the step.
pub(super) fn adamw<const L1: bool>(
    c: Coeffs,
    a: AdamStep,
    w: &mut [f32],
    g: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
) {
    let step = c.lr * a.correction;
    let shrink = c.lr * c.decay;
    each_with_two_histories(w, g, m, v, |wi, gi, mi, vi| {
        let grad = c.scale * *gi;
        *gi = grad;
        let r = if L1 { sign(*wi) } else { *wi };
        a.moments(grad, mi, vi);
        *wi -= shrink * r + step * *mi / (vi.sqrt() + a.eps);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_of_zero_is_zero() {
        assert_eq!(sign(0.0), 0.0);
        assert_eq!(sign(-0.0), 0.0);
        assert_eq!(sign(3.5), 1.0);
        assert_eq!(sign(-1e-30), -1.0);
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn mismatched_history_panics() {
        let c = Coeffs {
            scale: 1.0,
            decay: 0.0,
            lr: 0.1,
        };
        sgd::<false>(c, 0.9, &mut [0.0; 3], &mut [0.0; 3], &mut [0.0; 2]);
    }
}
