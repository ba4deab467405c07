//! When a certificate expires: its notAfter, read from the DER with just enough of a DER
//! reader to walk Certificate → tbsCertificate → validity (RFC 5280 §4.1), and turned into
//! Unix seconds. Pure: bytes in, a number out.

const SEQUENCE: u8 = 0x30;
/// `[0] EXPLICIT Version`, present unless the certificate is v1.
const VERSION: u8 = 0xa0;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// One DER element at the start of `der`: its tag, its content and what follows it.
fn element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        // Long form: the low bits say how many length bytes follow (DER: at least one).
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (bytes, rest) = rest.split_at(n);
        let len = bytes
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, rest)
    };
    if rest.len() < len {
        return None;
    }
    let (content, after) = rest.split_at(len);
    Some((tag, content, after))
}

/// The fields of tbsCertificate after its version: serialNumber, signature, issuer,
/// validity, subject (each as its whole DER element, tag and length included).
fn tbs_fields(der: &[u8]) -> Option<Vec<&[u8]>> {
    let (SEQUENCE, certificate, _) = element(der)? else {
        return None;
    };
    let (SEQUENCE, tbs, _) = element(certificate)? else {
        return None;
    };
    let (tag, _, after_version) = element(tbs)?;
    let mut rest = if tag == VERSION { after_version } else { tbs };
    // As many of the five as there are: a field that cannot be walked ends the list.
    let mut fields = Vec::new();
    while fields.len() < 5 {
        let Some((_, _, after)) = element(rest) else {
            break;
        };
        fields.push(&rest[..rest.len() - after.len()]);
        rest = after;
    }
    Some(fields)
}

/// The certificate's issuer Name, as DER, or `None` when `der` cannot be walked.
pub fn issuer(der: &[u8]) -> Option<&[u8]> {
    tbs_fields(der)?.get(2).copied()
}

/// The certificate's subject Name, as DER.
pub fn subject(der: &[u8]) -> Option<&[u8]> {
    tbs_fields(der)?.get(4).copied()
}

/// The certificate's notAfter in Unix seconds, or `None` when `der` is not a certificate
/// this reader can walk.
pub fn not_after(der: &[u8]) -> Option<i64> {
    let fields = tbs_fields(der)?;
    let (SEQUENCE, validity, _) = element(fields.get(3)?)? else {
        return None;
    };
    let (_, _, after_not_before) = element(validity)?;
    let (tag, time, _) = element(after_not_before)?;
    unix_seconds(tag, time)
}

/// A UTCTime (`YYMMDDHHMMSSZ`, years 1950–2049) or GeneralizedTime (`YYYYMMDDHHMMSSZ`), the
/// two forms RFC 5280 allows, in Unix seconds.
fn unix_seconds(tag: u8, text: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(text).ok()?;
    let number = |s: &str| -> Option<i64> {
        s.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| s.parse().ok())
            .flatten()
    };
    let (year, rest) = match tag {
        UTC_TIME => {
            let yy = number(text.get(..2)?)?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, text.get(2..)?)
        }
        GENERALIZED_TIME => (number(text.get(..4)?)?, text.get(4..)?),
        _ => return None,
    };
    let rest = rest.strip_suffix('Z')?;
    if rest.len() != 10 {
        return None;
    }
    let field = |i: usize| number(rest.get(i..i + 2)?);
    let (month, day) = (field(0)?, field(2)?);
    let (hour, minute, second) = (field(4)?, field(6)?, field(8)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
pub(super) fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::time::Duration;

    /// A self-signed certificate valid until `plus` after midnight (UTC) of `date`.
    fn certificate_until((year, month, day): (i32, u8, u8), plus: Duration) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(vec!["etcd-0".to_string()]).unwrap();
        params.not_after = rcgen::date_time_ymd(year, month, day) + plus;
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn the_not_after_of_a_certificate_is_read_to_the_second() {
        // 2030-01-02 01:02:03 UTC, written as a UTCTime.
        let der = certificate_until((2030, 1, 2), Duration::from_secs(3_723));
        assert_eq!(not_after(&der), Some(1_893_546_123));
    }

    #[test]
    fn dates_from_2050_on_are_read_from_their_generalized_time() {
        // RFC 5280: UTCTime up to 2049, GeneralizedTime from 2050 (rcgen's default notAfter
        // is 4096-01-01).
        let der = certificate_until((2050, 1, 1), Duration::ZERO);
        assert_eq!(not_after(&der), Some(2_524_608_000));
        let default = rcgen::CertificateParams::new(vec!["etcd-0".to_string()]).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let der = default.self_signed(&key).unwrap().der().to_vec();
        assert_eq!(not_after(&der), Some(67_090_118_400));
    }

    #[test]
    fn utc_time_years_before_50_are_this_century_and_from_50_the_last() {
        assert_eq!(
            unix_seconds(UTC_TIME, b"491231235959Z"),
            Some(2_524_607_999)
        );
        assert_eq!(unix_seconds(UTC_TIME, b"500101000000Z"), Some(-631_152_000));
        assert_eq!(unix_seconds(UTC_TIME, b"700101000000Z"), Some(0));
        assert_eq!(
            unix_seconds(GENERALIZED_TIME, b"20000229120000Z"),
            Some(951_825_600)
        );
    }

    #[test]
    fn times_that_are_not_in_rfc_5280_form_are_not_read() {
        for (tag, text) in [
            (UTC_TIME, &b"3001020102Z"[..]),       // no seconds
            (UTC_TIME, b"300102010203+0100"),      // not in UTC
            (UTC_TIME, b"301302010203Z"),          // month 13
            (GENERALIZED_TIME, b"2030010201020Z"), // one digit short
            (GENERALIZED_TIME, b"20300102010203.5Z"),
            (0x04, b"300102010203Z"), // an OCTET STRING
        ] {
            assert_eq!(unix_seconds(tag, text), None, "{text:?}");
        }
    }

    /// A certificate's DER, by hand: an empty algorithm, issuer and signature, validity
    /// 2030-01-02 01:02:03 to 2031-01-02 01:02:03 (UTCTime), with or without a version.
    fn by_hand(v3: bool) -> Vec<u8> {
        let wrap = |tag: u8, content: &[u8]| {
            let mut out = vec![tag, u8::try_from(content.len()).unwrap()];
            out.extend_from_slice(content);
            out
        };
        let mut validity = wrap(UTC_TIME, b"300102010203Z");
        validity.extend(wrap(UTC_TIME, b"310102010203Z"));
        let mut tbs = Vec::new();
        if v3 {
            tbs.extend(wrap(VERSION, &[0x02, 0x01, 0x02]));
        }
        tbs.extend([0x02, 0x01, 0x01, SEQUENCE, 0x00, SEQUENCE, 0x00]);
        tbs.extend(wrap(SEQUENCE, &validity));
        let mut certificate = wrap(SEQUENCE, &tbs);
        certificate.extend([SEQUENCE, 0x00, 0x03, 0x01, 0x00]);
        wrap(SEQUENCE, &certificate)
    }

    #[test]
    fn a_v1_certificate_without_a_version_field_is_read_too() {
        assert_eq!(not_after(&by_hand(true)), Some(1_925_082_123));
        assert_eq!(not_after(&by_hand(false)), Some(1_925_082_123));
    }

    #[test]
    fn what_is_not_a_certificate_has_no_expiry() {
        let der = certificate_until((2030, 1, 2), Duration::ZERO);
        assert_eq!(not_after(&[]), None);
        assert_eq!(not_after(b"not DER at all"), None);
        assert_eq!(not_after(&der[..der.len() / 3]), None, "truncated");
        // A SEQUENCE holding a SEQUENCE of one INTEGER: no validity to find.
        assert_eq!(not_after(&[0x30, 0x05, 0x30, 0x03, 0x02, 0x01, 0x01]), None);
    }
}
