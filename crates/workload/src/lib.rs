//! What zmem's access patterns draw from: the one Zipf sampler and the seeded generators, for the
//! benchmarks (`zmem bench region`, `bench adaptive`) and the region's policy simulator alike;
//! and page contents of a known kind for tests ([`phrase_page`]).

use rand::rngs::{SmallRng, StdRng};
use rand::{Rng, SeedableRng};

/// A reproducible generator for tables built once (permutations): `StdRng` from `seed`.
pub fn std_rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// A small, fast reproducible generator for access streams: `SmallRng` from `seed`.
pub fn small_rng(seed: u64) -> SmallRng {
    SmallRng::seed_from_u64(seed)
}

/// `len` bytes of 64 fixed phrases (30-70 letters and a space each) of phrase set `set`, in an
/// order given by `seed`: zstd finds few repeats inside one page, a dictionary learnt from such
/// pages finds them everywhere (the dictionary tests of the store and the region).
pub fn phrase_page(set: u64, seed: u64, len: usize) -> Vec<u8> {
    let xorshift = |x: &mut u64| {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    };
    let mut x = 0x2545_f491_4f6c_dd1du64 ^ set.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let phrases: Vec<Vec<u8>> = (0..64)
        .map(|_| {
            let n = 30 + xorshift(&mut x) as usize % 41;
            let mut p: Vec<u8> = (0..n)
                .map(|_| b'a' + (xorshift(&mut x) % 26) as u8)
                .collect();
            p.push(b' ');
            p
        })
        .collect();
    let mut y = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 80);
    while v.len() < len {
        v.extend_from_slice(&phrases[(xorshift(&mut y) % 64) as usize]);
    }
    v.truncate(len);
    v
}

/// Zipf distribution over ranks 0..n (rank k has weight 1/(k+1)^s), in one of two forms:
/// [`Zipf::new`], exact (a precomputed CDF and a binary search per sample; `bench region`), and
/// [`Zipf::continuous`], without tables (the continuous power law x^-s on [1, n+1) sampled by
/// inversion and floored to a rank, a little less skewed at the top; `bench adaptive`).
#[derive(Clone, Debug)]
pub enum Zipf {
    Exact { cdf: Vec<f64> },
    Continuous { n: u64, s: f64, a: f64 },
}

impl Zipf {
    /// The exact distribution; n >= 1, s > 0.
    pub fn new(n: usize, s: f64) -> Zipf {
        let n = n.max(1);
        let mut cdf = Vec::with_capacity(n);
        let mut acc = 0.0f64;
        for k in 1..=n {
            acc += (k as f64).powf(-s);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf::Exact { cdf }
    }

    /// The table-free continuous form; n >= 1, s > 0.
    pub fn continuous(n: u64, s: f64) -> Zipf {
        let n1 = (n + 1) as f64;
        let a = if (1.0 - s).abs() < 1e-9 {
            n1.ln()
        } else {
            n1.powf(1.0 - s) - 1.0
        };
        Zipf::Continuous { n, s, a }
    }

    pub fn len(&self) -> usize {
        match self {
            Zipf::Exact { cdf } => cdf.len(),
            Zipf::Continuous { n, .. } => *n as usize,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The rank for a uniform `u` in [0, 1).
    pub fn rank(&self, u: f64) -> usize {
        match self {
            Zipf::Exact { cdf } => cdf.partition_point(|&c| c <= u).min(cdf.len() - 1),
            &Zipf::Continuous { n, s, a } => {
                let x = if (1.0 - s).abs() < 1e-9 {
                    (u * a).exp()
                } else {
                    (1.0 + u * a).powf(1.0 / (1.0 - s))
                };
                (x as u64).saturating_sub(1).min(n - 1) as usize
            }
        }
    }

    pub fn sample<R: Rng>(&self, rng: &mut R) -> usize {
        self.rank(rng.random::<f64>())
    }

    /// Probability of rank k (of the exact form; None for the continuous one).
    pub fn pmf(&self, k: usize) -> Option<f64> {
        match self {
            Zipf::Exact { cdf } => Some(match k {
                0 => cdf[0],
                _ => cdf[k] - cdf[k - 1],
            }),
            Zipf::Continuous { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_pmf_and_sampling() {
        let z = Zipf::new(1000, 0.99);
        let h: f64 = (1..=1000).map(|k| (k as f64).powf(-0.99)).sum();
        assert!((z.pmf(0).unwrap() - 1.0 / h).abs() < 1e-12);
        assert!((z.pmf(9).unwrap() - 10f64.powf(-0.99) / h).abs() < 1e-12);
        assert_eq!(z.rank(0.0), 0);
        assert_eq!(z.rank(0.999_999_999_999), 999);
        let mut rng = std_rng(1);
        let n = 200_000;
        let mut c0 = 0;
        let mut c9 = 0;
        for _ in 0..n {
            match z.sample(&mut rng) {
                0 => c0 += 1,
                9 => c9 += 1,
                _ => {}
            }
        }
        let f0 = c0 as f64 / n as f64;
        let f9 = c9 as f64 / n as f64;
        assert!(
            (f0 - z.pmf(0).unwrap()).abs() < 0.01,
            "{f0} vs {}",
            z.pmf(0).unwrap()
        );
        assert!(
            (f9 - z.pmf(9).unwrap()).abs() < 0.005,
            "{f9} vs {}",
            z.pmf(9).unwrap()
        );
    }

    #[test]
    fn continuous_zipf_is_skewed_and_in_range() {
        let z = Zipf::continuous(1000, 0.99);
        let mut rng = small_rng(1);
        let mut hist = vec![0u32; 1000];
        for _ in 0..100_000 {
            hist[z.sample(&mut rng)] += 1;
        }
        assert!(hist[0] > hist[10] && hist[10] > hist[500]);
        let top10: u32 = hist[..10].iter().sum();
        assert!(top10 > 20_000, "top 10 ranks got {top10}");
        assert_eq!(z.rank(0.0), 0);
        assert_eq!(z.rank(0.999_999_999), 999);
        let one = Zipf::continuous(10, 1.0);
        assert!(one.rank(0.5) < 10);
    }
}
