//! DCQCN parameters under their mlx5 names (`/sys/kernel/debug/mlx5/<pci>/cc_params/*`,
//! drivers/infiniband/hw/mlx5/cong.c), in the units the firmware takes them, with the
//! ConnectX defaults and the SIGCOMM 2015 paper values.
//!
//! Contract: a [`DcqcnParams`] only ever holds values inside each parameter's range
//! ([`DcqcnParams::set`] refuses anything else), so the algorithm never has to re-check.
//! Every parameter is listed once in [`PARAMS`] with its unit, range and meaning; the
//! parser reads that table, and a test checks the table of docs/congestion.md against it.
//!
//! What each value *means* in xrnic is decided in [`PARAMS`] and in
//! [`super::dcqcn`]; where NVIDIA's documentation does not pin the meaning down the entry
//! says "unverified".

use core::fmt;

/// Every DCQCN knob, raw values in mlx5 units (see [`PARAMS`] for units and meaning).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DcqcnParams {
    pub rp_time_reset: u32,
    pub rp_byte_reset: u32,
    pub rp_threshold: u32,
    pub rp_max_rate: u32,
    pub rp_ai_rate: u32,
    pub rp_hai_rate: u32,
    pub rp_gd: u32,
    pub rp_min_dec_fac: u32,
    pub rp_min_rate: u32,
    pub rp_rate_to_set_on_first_cnp: u32,
    pub rp_dce_tcp_g: u32,
    pub rp_dce_tcp_rtt: u32,
    pub rp_rate_reduce_monitor_period: u32,
    pub rp_initial_alpha_value: u32,
    pub rp_clamp_tgt_rate: u32,
    pub rp_clamp_tgt_rate_after_time_inc: u32,
    pub np_min_time_between_cnps: u32,
    pub np_cnp_dscp: u32,
    pub np_cnp_prio: u32,
    /// What the knobs do not say: how α is updated, whether the limiter is released at
    /// full rate. Not an mlx5 parameter: set by the profile (see [`DcqcnStyle`]).
    pub style: DcqcnStyle,
}

/// The parts of DCQCN no mlx5 knob covers, as each reference describes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DcqcnStyle {
    /// NVIDIA's description (mstflint's tools_open_roce_cc_ecn register, HPCC's ns-3
    /// `*Mlx` functions): α is updated once per `rp_dce_tcp_rtt` period, up if a CNP came
    /// in the period and down if not; the limiter is released once back at the maximum
    /// rate (`rpg_max_rate`: "once this limit is reached, the RP rate limiter is
    /// released").
    ConnectX,
    /// The SIGCOMM 2015 paper: α ← (1 − g)α + g at each cut, decaying once per K without
    /// one; no release (a QP back at the maximum rate stays under the control loop).
    Paper,
}

/// One row of the parameter table.
#[derive(Clone, Copy, Debug)]
pub struct ParamInfo {
    /// The mlx5 debugfs name.
    pub name: &'static str,
    /// Another accepted spelling (the NVIDIA documentation's long form).
    pub alias: Option<&'static str>,
    /// Unit of the raw value.
    pub unit: &'static str,
    pub min: u32,
    pub max: u32,
    /// What xrnic does with it.
    pub meaning: &'static str,
    get: fn(&DcqcnParams) -> u32,
    set: fn(&mut DcqcnParams, u32),
}

/// Upper bound of the time parameters: NVIDIA documents 1…131071 µs for dce_tcp_rtt; we
/// use the same bound for every µs parameter (the others' firmware ranges are unverified).
const MAX_US: u32 = 131_071;
/// Upper bound of rate parameters in Mb/s (1 Tb/s): ours, not the firmware's.
const MAX_MBPS: u32 = 1_000_000;

macro_rules! row {
    ($name:ident, $alias:expr, $unit:expr, $min:expr, $max:expr, $meaning:expr) => {
        ParamInfo {
            name: stringify!($name),
            alias: $alias,
            unit: $unit,
            min: $min,
            max: $max,
            meaning: $meaning,
            get: |p| p.$name,
            set: |p, v| p.$name = v,
        }
    };
}

/// Every parameter: name, unit, range, meaning in xrnic.
pub const PARAMS: &[ParamInfo] = &[
    row!(
        rp_time_reset,
        None,
        "µs",
        1,
        MAX_US,
        "period T of the rate-increase timer; each expiry is one increase event (paper: timer T)"
    ),
    row!(
        rp_byte_reset,
        None,
        "64 B",
        0,
        u32::MAX,
        "byte counter B: every rp_byte_reset × 64 bytes sent while rate-limited is one increase \
         event; 0 disables the byte counter (unit 64 B unverified: 32767 × 64 B ≈ 2 MiB)"
    ),
    row!(
        rp_threshold,
        None,
        "events",
        1,
        31,
        "F: the first F expirations of each counter (timer, byte) are fast-recovery rounds; \
         past F on one counter additive increase, past F on both hyper increase"
    ),
    row!(
        rp_max_rate,
        None,
        "Mb/s",
        0,
        MAX_MBPS,
        "rate cap of a QP; 0 means the line rate given to the reaction point"
    ),
    row!(
        rp_ai_rate,
        None,
        "Mb/s",
        1,
        MAX_MBPS,
        "R_AI: target-rate step of each additive-increase event"
    ),
    row!(
        rp_hai_rate,
        None,
        "Mb/s",
        1,
        MAX_MBPS,
        "R_HAI: hyper increase adds i × R_HAI to the target, i = min(timer, byte events) − F"
    ),
    row!(
        rp_gd,
        None,
        "shift",
        0,
        15,
        "α-to-rate shift: a cut multiplies the rate by 1 − α·2^(10 − rp_gd), so 11 gives the \
         paper's 1 − α/2 (α held with 10 fraction bits; unverified)"
    ),
    row!(
        rp_min_dec_fac,
        None,
        "%",
        0,
        100,
        "one cut leaves at least rp_min_dec_fac % of the rate (100: never cut, 0: no bound)"
    ),
    row!(
        rp_min_rate,
        None,
        "Mb/s",
        1,
        MAX_MBPS,
        "rate floor: no cut goes below it"
    ),
    row!(
        rp_rate_to_set_on_first_cnp,
        None,
        "Mb/s",
        0,
        MAX_MBPS,
        "non-zero: the first CNP of an unthrottled QP sets current and target rate to this \
         value (the rate its limiter is allocated at), then cuts like any CNP; 0: the \
         limiter starts at the maximum rate"
    ),
    row!(
        rp_dce_tcp_g,
        None,
        "1/1024",
        0,
        1023,
        "α gain g = rp_dce_tcp_g/1024, as NVIDIA's register description: α ← g + (1 − g)·α \
         with a CNP, α ← (1 − g)·α without (the paper's g = 1/256 is 4)"
    ),
    row!(
        rp_dce_tcp_rtt,
        None,
        "µs",
        1,
        MAX_US,
        "α update period (the paper's K): ConnectX style, one update per period counted \
         from the first CNP; paper style, a decay per full period since the last cut"
    ),
    row!(
        rp_rate_reduce_monitor_period,
        None,
        "µs",
        0,
        MAX_US,
        "at most one cut per period: a CNP less than this after the last cut is kept and \
         cuts at the start of the next period (counted from the first CNP); several CNPs \
         in one period make one cut; 0: every CNP cuts at once"
    ),
    row!(
        rp_initial_alpha_value,
        None,
        "1/1024",
        0,
        1024,
        "α given to a QP when its first CNP arrives (1024 = α 1, the paper's start, is an xrnic \
         extension; the firmware takes 0…1023)"
    ),
    row!(
        rp_clamp_tgt_rate,
        None,
        "bool",
        0,
        1,
        "1: every cut first sets the target rate to the current rate (the paper's Rt ← Rc)"
    ),
    row!(
        rp_clamp_tgt_rate_after_time_inc,
        Some("rp_clamp_tgt_rate_ati"),
        "bool",
        0,
        1,
        "with rp_clamp_tgt_rate 0, a cut sets Rt ← Rc if the byte counter raised the rate \
         since the last cut, and with this flag 1 also if the timer did (NVIDIA: \"and not \
         only due to the byte counter\")"
    ),
    row!(
        np_min_time_between_cnps,
        None,
        "µs",
        0,
        MAX_US,
        "notification point: at most one CNP per QP per this interval (paper: 50 µs)"
    ),
    row!(
        np_cnp_dscp,
        None,
        "DSCP",
        0,
        63,
        "DSCP of the CNPs we send (48 → IPv4 TOS 0xC2 with ECT(0), as ConnectX)"
    ),
    row!(
        np_cnp_prio,
        None,
        "PCP",
        0,
        7,
        "802.1p priority of the CNPs we send, used when the QP's frames are VLAN-tagged"
    ),
];

/// Why a `name=value` setting was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamError {
    /// No `=` in the setting.
    Syntax(String),
    /// No parameter of that name.
    UnknownName(String),
    /// The value is not a non-negative integer.
    NotANumber { name: &'static str, value: String },
    /// The value is outside the parameter's range.
    OutOfRange {
        name: &'static str,
        value: u64,
        min: u32,
        max: u32,
        unit: &'static str,
    },
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamError::Syntax(s) => {
                write!(f, "'{s}' is not name=value (e.g. rp_ai_rate=10)")
            }
            ParamError::UnknownName(n) => {
                write!(f, "unknown DCQCN parameter '{n}'; known: ")?;
                let names: Vec<&str> = PARAMS.iter().map(|p| p.name).collect();
                write!(f, "{}", names.join(", "))
            }
            ParamError::NotANumber { name, value } => {
                write!(f, "{name}: '{value}' is not a non-negative integer")
            }
            ParamError::OutOfRange {
                name,
                value,
                min,
                max,
                unit,
            } => write!(f, "{name}={value} is out of range {min}…{max} ({unit})"),
        }
    }
}

impl std::error::Error for ParamError {}

impl DcqcnParams {
    /// NVIDIA ConnectX defaults (names as in the kernel's mlx5 cc_params,
    /// drivers/infiniband/hw/mlx5/cong.c; firmware values as dumped by mlxconfig;
    /// docs/congestion.md says which are unverified).
    pub const fn connectx() -> Self {
        DcqcnParams {
            rp_time_reset: 300,
            rp_byte_reset: 32767,
            rp_threshold: 1,
            rp_max_rate: 0,
            rp_ai_rate: 5,
            rp_hai_rate: 50,
            rp_gd: 11,
            rp_min_dec_fac: 50,
            rp_min_rate: 1,
            rp_rate_to_set_on_first_cnp: 0,
            rp_dce_tcp_g: 1019,
            rp_dce_tcp_rtt: 1,
            rp_rate_reduce_monitor_period: 4,
            rp_initial_alpha_value: 1023,
            rp_clamp_tgt_rate: 0,
            rp_clamp_tgt_rate_after_time_inc: 1,
            np_min_time_between_cnps: 4,
            np_cnp_dscp: 48,
            np_cnp_prio: 6,
            style: DcqcnStyle::ConnectX,
        }
    }

    /// The SIGCOMM 2015 paper (Zhu et al.): g = 1/256, K = 55 µs, F = 5, R_AI = 40 Mb/s,
    /// CNP interval 50 µs, Rt ← Rc and Rc ← Rc(1 − α/2) on every CNP, α starting at 1,
    /// α per cut and no release ([`DcqcnStyle::Paper`]). T, B, R_HAI and the minimum
    /// rate keep the ConnectX values (docs/congestion.md says why).
    pub const fn paper() -> Self {
        let mut p = Self::connectx();
        p.rp_dce_tcp_g = 4; // g = 1/256
        p.rp_dce_tcp_rtt = 55;
        p.rp_threshold = 5;
        p.rp_ai_rate = 40;
        p.np_min_time_between_cnps = 50;
        p.rp_gd = 11;
        p.rp_min_dec_fac = 0;
        p.rp_rate_reduce_monitor_period = 0;
        p.rp_initial_alpha_value = 1024;
        p.rp_clamp_tgt_rate = 1;
        p.style = DcqcnStyle::Paper;
        p
    }

    /// The table row of `name` (or its alias).
    pub fn info(name: &str) -> Option<&'static ParamInfo> {
        PARAMS
            .iter()
            .find(|p| p.name == name || p.alias == Some(name))
    }

    /// The raw value of parameter `name`.
    pub fn get(&self, name: &str) -> Result<u32, ParamError> {
        let info = Self::info(name).ok_or_else(|| ParamError::UnknownName(name.into()))?;
        Ok((info.get)(self))
    }

    /// Set parameter `name` to `value` (raw, in its unit), checking the range.
    pub fn set(&mut self, name: &str, value: u64) -> Result<(), ParamError> {
        let info = Self::info(name).ok_or_else(|| ParamError::UnknownName(name.into()))?;
        if value < u64::from(info.min) || value > u64::from(info.max) {
            return Err(ParamError::OutOfRange {
                name: info.name,
                value,
                min: info.min,
                max: info.max,
                unit: info.unit,
            });
        }
        // In range, so it fits the u32 field.
        (info.set)(self, value as u32);
        Ok(())
    }

    /// Apply one `name=value` setting, e.g. `"rp_ai_rate=10"` (spaces around are allowed;
    /// the value is decimal or `0x` hex, like the debugfs files take).
    pub fn apply(&mut self, setting: &str) -> Result<(), ParamError> {
        let (name, value) = setting
            .split_once('=')
            .ok_or_else(|| ParamError::Syntax(setting.into()))?;
        let (name, value) = (name.trim(), value.trim());
        let info = Self::info(name).ok_or_else(|| ParamError::UnknownName(name.into()))?;
        let parsed = match value
            .strip_prefix("0x")
            .or_else(|| value.strip_prefix("0X"))
        {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => value.parse::<u64>(),
        };
        let v = parsed.map_err(|_| ParamError::NotANumber {
            name: info.name,
            value: value.into(),
        })?;
        self.set(info.name, v)
    }

    /// Apply a comma- or whitespace-separated list of settings, stopping at the first error
    /// (nothing is changed then).
    pub fn apply_all(&mut self, settings: &str) -> Result<(), ParamError> {
        let mut p = *self;
        for s in settings
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
        {
            p.apply(s)?;
        }
        *self = p;
        Ok(())
    }

    /// Every parameter as `(name, raw value)`, in table order (for `show`-style output).
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u32)> + '_ {
        PARAMS.iter().map(move |p| (p.name, (p.get)(self)))
    }

    // ----- the values in the units the algorithm uses -------------------------------

    pub(crate) fn time_reset_ns(&self) -> u64 {
        u64::from(self.rp_time_reset) * 1000
    }
    pub(crate) fn byte_reset_bytes(&self) -> u64 {
        u64::from(self.rp_byte_reset) * 64
    }
    pub(crate) fn alpha_period_ns(&self) -> u64 {
        u64::from(self.rp_dce_tcp_rtt) * 1000
    }
    pub(crate) fn monitor_period_ns(&self) -> u64 {
        u64::from(self.rp_rate_reduce_monitor_period) * 1000
    }
    /// g: the weight of a new CNP in α (`rp_dce_tcp_g` / 1024, NVIDIA's register text).
    pub(crate) fn alpha_gain(&self) -> f64 {
        f64::from(self.rp_dce_tcp_g) / 1024.0
    }
    pub(crate) fn initial_alpha(&self) -> f64 {
        f64::from(self.rp_initial_alpha_value) / 1024.0
    }
    pub fn np_interval_ns(&self) -> u64 {
        u64::from(self.np_min_time_between_cnps) * 1000
    }
}

impl Default for DcqcnParams {
    fn default() -> Self {
        Self::connectx()
    }
}

/// Mb/s to bit/s.
pub(crate) fn mbps(v: u32) -> f64 {
    f64::from(v) * 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_is_in_range_and_names_are_unique() {
        for p in [DcqcnParams::connectx(), DcqcnParams::paper()] {
            for info in PARAMS {
                let v = (info.get)(&p);
                assert!(info.min <= v && v <= info.max, "{} = {v}", info.name);
            }
        }
        let mut names: Vec<&str> = PARAMS.iter().map(|p| p.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), PARAMS.len());
        assert_eq!(PARAMS.len(), 19);
    }

    #[test]
    fn connectx_defaults_by_name() {
        let p = DcqcnParams::connectx();
        let want = [
            ("rp_time_reset", 300),
            ("rp_byte_reset", 32767),
            ("rp_threshold", 1),
            ("rp_max_rate", 0),
            ("rp_ai_rate", 5),
            ("rp_hai_rate", 50),
            ("rp_gd", 11),
            ("rp_min_dec_fac", 50),
            ("rp_min_rate", 1),
            ("rp_rate_to_set_on_first_cnp", 0),
            ("rp_dce_tcp_g", 1019),
            ("rp_dce_tcp_rtt", 1),
            ("rp_rate_reduce_monitor_period", 4),
            ("rp_initial_alpha_value", 1023),
            ("rp_clamp_tgt_rate", 0),
            ("rp_clamp_tgt_rate_after_time_inc", 1),
            ("np_min_time_between_cnps", 4),
            ("np_cnp_dscp", 48),
            ("np_cnp_prio", 6),
        ];
        for (n, v) in want {
            assert_eq!(p.get(n), Ok(v), "{n}");
        }
        assert_eq!(p.get("rp_clamp_tgt_rate_ati"), Ok(1));
    }

    #[test]
    fn apply_by_name() {
        let mut p = DcqcnParams::connectx();
        p.apply("rp_ai_rate=10").unwrap();
        assert_eq!(p.rp_ai_rate, 10);
        p.apply(" rp_clamp_tgt_rate_ati = 0 ").unwrap();
        assert_eq!(p.rp_clamp_tgt_rate_after_time_inc, 0);
        p.apply("np_cnp_dscp=0x1a").unwrap();
        assert_eq!(p.np_cnp_dscp, 26);
        p.apply_all("rp_gd=10, rp_threshold=5 rp_min_dec_fac=100")
            .unwrap();
        assert_eq!((p.rp_gd, p.rp_threshold, p.rp_min_dec_fac), (10, 5, 100));
    }

    #[test]
    fn bad_settings_are_clear_errors_and_change_nothing() {
        let mut p = DcqcnParams::connectx();
        let e = p.apply("rp_ai_rat=10").unwrap_err();
        assert_eq!(e, ParamError::UnknownName("rp_ai_rat".into()));
        assert!(e.to_string().contains("known: rp_time_reset"));
        let e = p.apply("rp_min_dec_fac=101").unwrap_err();
        assert_eq!(
            e,
            ParamError::OutOfRange {
                name: "rp_min_dec_fac",
                value: 101,
                min: 0,
                max: 100,
                unit: "%"
            }
        );
        assert_eq!(
            e.to_string(),
            "rp_min_dec_fac=101 is out of range 0…100 (%)"
        );
        assert!(matches!(
            p.apply("rp_threshold=0"),
            Err(ParamError::OutOfRange { .. })
        ));
        assert!(matches!(
            p.apply("rp_ai_rate=-1"),
            Err(ParamError::NotANumber { .. })
        ));
        assert!(matches!(
            p.apply("rp_byte_reset=99999999999"),
            Err(ParamError::OutOfRange { .. })
        ));
        assert!(matches!(p.apply("rp_ai_rate"), Err(ParamError::Syntax(_))));
        assert!(p.apply_all("rp_ai_rate=7,rp_gd=99").is_err());
        assert_eq!(p, DcqcnParams::connectx());
    }
}
