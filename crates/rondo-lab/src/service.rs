//! A simulated member's service-time distribution: the kinds a scenario's `service = { dist =
//! ... }` can name (constant, exponential, lognormal, Pareto, bimodal), their true means (which
//! the oracle knows) and their sampling from common random numbers; and the parsing of that
//! table with located errors.

use serde::Deserialize;
use toml::Spanned;

use crate::located::{Ctx, ScenarioError, ms};

/// A member's service-time distribution (its true one; the oracle knows it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Service {
    /// Always `mean`.
    Constant {
        /// ns.
        mean: f64,
    },
    /// Exponential with `mean`.
    Exponential {
        /// ns.
        mean: f64,
    },
    /// Lognormal with the given mean and shape `sigma`.
    Lognormal {
        /// ns.
        mean: f64,
        /// Shape (standard deviation of the log).
        sigma: f64,
    },
    /// Pareto (type I) with the given mean and tail index `alpha` (> 1, so the mean exists;
    /// at most 2 the variance does not): a heavier tail than any lognormal.
    Pareto {
        /// ns.
        mean: f64,
        /// Tail index.
        alpha: f64,
    },
    /// `slow` with probability `p`, else `fast`.
    Bimodal {
        /// ns.
        fast: f64,
        /// ns.
        slow: f64,
        /// Probability of `slow`.
        p: f64,
    },
}

impl Service {
    /// The true mean, ns.
    pub fn mean(self) -> f64 {
        match self {
            Service::Constant { mean }
            | Service::Exponential { mean }
            | Service::Lognormal { mean, .. }
            | Service::Pareto { mean, .. } => mean,
            Service::Bimodal { fast, slow, p } => fast * (1.0 - p) + slow * p,
        }
    }

    /// A sample from two uniforms in [0, 1) (common random numbers: every algorithm sees the
    /// same uniforms for the same request, so differences come from the picks alone).
    pub fn sample(self, u1: f64, u2: f64) -> f64 {
        match self {
            Service::Constant { mean } => mean,
            Service::Exponential { mean } => -mean * (1.0 - u1).ln(),
            Service::Lognormal { mean, sigma } => {
                // Box-Muller; mu chosen so that the mean is `mean`.
                let z = (-2.0 * (1.0 - u1).ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                let mu = mean.ln() - sigma * sigma / 2.0;
                (mu + sigma * z).exp()
            }
            Service::Pareto { mean, alpha } => {
                // Inverse transform; the scale chosen so that the mean is `mean`.
                let scale = mean * (alpha - 1.0) / alpha;
                scale / (1.0 - u1).powf(1.0 / alpha)
            }
            Service::Bimodal { fast, slow, p } => {
                if u1 < p {
                    slow
                } else {
                    fast
                }
            }
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawService {
    dist: Spanned<String>,
    mean_ms: Option<f64>,
    sigma: Option<f64>,
    alpha: Option<f64>,
    fast_ms: Option<f64>,
    slow_ms: Option<f64>,
    slow_fraction: Option<f64>,
}

fn positive(v: Option<f64>) -> bool {
    v.is_some_and(|v| v.is_finite() && v > 0.0)
}

pub(crate) fn parse_service(
    cx: &Ctx<'_>,
    s: &Spanned<RawService>,
    field: &str,
) -> Result<Service, ScenarioError> {
    let at = s.span().start;
    let r = s.get_ref();
    let need_mean = |what: &str| -> Result<f64, ScenarioError> {
        if !positive(r.mean_ms) {
            return Err(cx.err(
                at,
                format!("{field}.mean_ms"),
                format!("{what} needs a positive mean_ms"),
            ));
        }
        Ok(ms(r.mean_ms.unwrap_or_default()))
    };
    Ok(match r.dist.get_ref().as_str() {
        "constant" => Service::Constant { mean: need_mean("constant")? },
        "exponential" => Service::Exponential { mean: need_mean("exponential")? },
        "lognormal" => {
            let mean = need_mean("lognormal")?;
            let sigma = r.sigma.unwrap_or(1.0);
            if !(sigma.is_finite() && sigma > 0.0 && sigma <= 4.0) {
                return Err(cx.err(at, format!("{field}.sigma"), "sigma must be in (0, 4]"));
            }
            Service::Lognormal { mean, sigma }
        }
        "pareto" => {
            let mean = need_mean("pareto")?;
            let alpha = r.alpha.unwrap_or(2.0);
            if !(alpha.is_finite() && alpha > 1.0 && alpha <= 10.0) {
                return Err(cx.err(at, format!("{field}.alpha"), "alpha must be in (1, 10]"));
            }
            Service::Pareto { mean, alpha }
        }
        "bimodal" => {
            if !positive(r.fast_ms) || !positive(r.slow_ms) {
                return Err(cx.err(
                    at,
                    format!("{field}.fast_ms"),
                    "bimodal needs positive fast_ms and slow_ms",
                ));
            }
            let p = r.slow_fraction.unwrap_or(0.1);
            if !(0.0..=1.0).contains(&p) {
                return Err(cx.err(
                    at,
                    format!("{field}.slow_fraction"),
                    "slow_fraction must be in [0, 1]",
                ));
            }
            Service::Bimodal {
                fast: ms(r.fast_ms.unwrap_or_default()),
                slow: ms(r.slow_ms.unwrap_or_default()),
                p,
            }
        }
        other => {
            return Err(cx.err(
                r.dist.span().start,
                format!("{field}.dist"),
                format!(
                    "unknown distribution {other:?} (constant, exponential, lognormal, pareto, bimodal)"
                ),
            ));
        }
    })
}
