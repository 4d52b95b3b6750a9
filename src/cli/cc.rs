//! The congestion-control options the traffic tools share (`xrnic perf`, `xrnic
//! rc-pingpong`): the DCQCN switch, its profile, per-parameter overrides under the mlx5
//! `cc_params` names, and the QPs' traffic class.
//!
//! Contract:
//! - `--dcqcn` turns DCQCN on with the ConnectX defaults; `--cc-profile connectx|paper`
//!   picks the parameter set and `--cc-param NAME=VALUE` (repeatable, or comma-separated)
//!   overrides one parameter in its raw mlx5 unit; either implies `--dcqcn`. `--no-dcqcn`
//!   turns it off (the default is [`crate::verbs::DEFAULT_DCQCN`]) and conflicts with the
//!   three others.
//! - Every `--cc-param` is checked while the command line is parsed: an unknown name (the
//!   message lists the known ones), a value that is not a number or out of the parameter's
//!   range is a usage error (clap: message, exit status 2), never a panic.
//! - `--tclass N` is the IP traffic class (DSCP << 2 | ECN) of every QP's frames, like
//!   perftest's `--tclass`; with DCQCN on and the ECN bits 0, frames are ECT(0).

use crate::proto::congestion::DcqcnParams;

/// A DCQCN parameter set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CcProfile {
    /// NVIDIA ConnectX firmware defaults (docs/congestion.md).
    Connectx,
    /// The SIGCOMM 2015 paper's values.
    Paper,
}

impl CcProfile {
    pub fn params(self) -> DcqcnParams {
        match self {
            CcProfile::Connectx => DcqcnParams::connectx(),
            CcProfile::Paper => DcqcnParams::paper(),
        }
    }
}

#[derive(Clone, Debug, Default, clap::Args)]
pub struct CcArgs {
    /// Run DCQCN congestion control (the default; ConnectX parameters unless
    /// --cc-profile): data is ECN-capable, CE marks are answered with CNPs, CNPs cut the
    /// QP's rate.
    #[arg(long)]
    pub dcqcn: bool,
    /// No congestion control: data frames Not-ECT (like rxe), CNPs ignored.
    #[arg(long = "no-dcqcn", conflicts_with_all = ["dcqcn", "cc_profile", "cc_param"])]
    pub no_dcqcn: bool,
    /// DCQCN parameter set (implies --dcqcn).
    #[arg(long = "cc-profile", value_enum, value_name = "PROFILE")]
    pub cc_profile: Option<CcProfile>,
    /// Set one DCQCN parameter by its mlx5 cc_params name in its raw unit, e.g.
    /// rp_ai_rate=10 (Mb/s); repeat it or separate with commas (implies --dcqcn). Names and
    /// units: docs/congestion.md.
    #[arg(long = "cc-param", value_name = "NAME=VALUE", value_parser = parse_cc_param)]
    pub cc_param: Vec<String>,
    /// IP traffic class of the QPs' frames: DSCP << 2 | ECN (perftest --tclass).
    #[arg(long, value_name = "TCLASS")]
    pub tclass: Option<u8>,
}

/// clap value parser of `--cc-param`: the setting(s) must apply to a parameter set.
pub fn parse_cc_param(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("empty setting: give NAME=VALUE, e.g. rp_ai_rate=10".into());
    }
    DcqcnParams::connectx()
        .apply_all(s)
        .map(|()| s.to_string())
        .map_err(|e| e.to_string())
}

impl CcArgs {
    /// The DCQCN parameters the options ask for, or `None` for no congestion control.
    pub fn dcqcn(&self) -> Result<Option<DcqcnParams>, String> {
        let default = crate::verbs::DEFAULT_DCQCN;
        if self.no_dcqcn {
            return Ok(None);
        }
        let asked = self.dcqcn || self.cc_profile.is_some() || !self.cc_param.is_empty();
        if !asked {
            return Ok(default);
        }
        let mut p = match self.cc_profile {
            Some(prof) => prof.params(),
            None => default.unwrap_or_default(),
        };
        for s in &self.cc_param {
            p.apply_all(s).map_err(|e| e.to_string())?;
        }
        Ok(Some(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, clap::Parser)]
    struct W {
        #[command(flatten)]
        cc: CcArgs,
    }

    fn parse(v: &[&str]) -> Result<CcArgs, clap::Error> {
        let mut all = vec!["t"];
        all.extend_from_slice(v);
        W::try_parse_from(all).map(|w| w.cc)
    }

    #[test]
    fn switch_profile_and_overrides() {
        assert_eq!(parse(&[]).unwrap().dcqcn(), Ok(crate::verbs::DEFAULT_DCQCN));
        assert_eq!(
            parse(&["--dcqcn"]).unwrap().dcqcn(),
            Ok(Some(DcqcnParams::connectx()))
        );
        assert_eq!(parse(&["--no-dcqcn"]).unwrap().dcqcn(), Ok(None));
        assert_eq!(
            parse(&["--cc-profile", "paper"]).unwrap().dcqcn(),
            Ok(Some(DcqcnParams::paper()))
        );
        let p = parse(&[
            "--cc-param",
            "rp_ai_rate=10",
            "--cc-param",
            "rp_time_reset=1000,rp_clamp_tgt_rate_ati=0",
        ])
        .unwrap()
        .dcqcn()
        .unwrap()
        .expect("--cc-param implies --dcqcn");
        let mut want = DcqcnParams::connectx();
        want.rp_ai_rate = 10;
        want.rp_time_reset = 1000;
        want.rp_clamp_tgt_rate_after_time_inc = 0;
        assert_eq!(p, want);
        // Overrides apply on top of the chosen profile.
        let p = parse(&["--cc-profile", "paper", "--cc-param", "rp_ai_rate=7"])
            .unwrap()
            .dcqcn()
            .unwrap()
            .unwrap();
        assert_eq!((p.rp_ai_rate, p.rp_threshold), (7, 5));
        assert_eq!(parse(&["--tclass", "106"]).unwrap().tclass, Some(106));
    }

    #[test]
    fn bad_settings_are_usage_errors_naming_the_problem() {
        let msg = |v: &[&str]| {
            let e = parse(v).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{v:?}");
            e.to_string()
        };
        let m = msg(&["--cc-param", "rp_ai_rat=10"]);
        assert!(m.contains("unknown DCQCN parameter 'rp_ai_rat'"), "{m}");
        assert!(m.contains("rp_ai_rate"), "the known names are listed: {m}");
        let m = msg(&["--cc-param", "rp_min_dec_fac=101"]);
        assert!(
            m.contains("rp_min_dec_fac=101 is out of range 0…100 (%)"),
            "{m}"
        );
        let m = msg(&["--cc-param", "rp_gd=eleven"]);
        assert!(m.contains("'eleven' is not a non-negative integer"), "{m}");
        let m = msg(&["--cc-param", "rp_gd"]);
        assert!(m.contains("not name=value"), "{m}");
        let m = msg(&["--cc-param", ""]);
        assert!(m.contains("empty setting"), "{m}");
        let m = msg(&["--cc-profile", "dctcp"]);
        assert!(m.contains("connectx") && m.contains("paper"), "{m}");
        for both in [
            &["--no-dcqcn", "--dcqcn"][..],
            &["--no-dcqcn", "--cc-profile", "paper"],
            &["--no-dcqcn", "--cc-param", "rp_gd=10"],
        ] {
            assert!(parse(both).is_err(), "{both:?}");
        }
        assert!(parse(&["--tclass", "256"]).is_err());
    }
}
