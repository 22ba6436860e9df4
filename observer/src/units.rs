//! How durations are written in every text observer prints (path checks,
//! reports): to the millisecond, whole seconds without decimals.

/// `60 s`, `2.4 s`, `0.061 s`.
#[must_use]
pub fn fmt_secs(s: f64) -> String {
    format!("{} s", fmt_num(s))
}

/// The number [`fmt_secs`] writes, without the unit: `60`, `2.4`, `0.061`.
#[must_use]
pub fn fmt_num(s: f64) -> String {
    let r = (s * 1000.0).round() / 1000.0;
    if (r - r.round()).abs() < 1e-9 {
        format!("{r:.0}")
    } else {
        format!("{r}")
    }
}
