//! Figure 7: what the agent adds to etcd's image. With `docker` and the image
//! `etcd-steward:test` (images/build-test-image.sh) the image's layers are measured;
//! otherwise the binaries.

use std::path::Path;

use anyhow::Result;

use crate::stats::{Figure, Target};

const MB: f64 = 1_000_000.0;

fn docker(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("docker")
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn run(image: &str, steward_bin: &Path, etcd_bin: &Path) -> Result<Vec<Figure>> {
    if let Some(f) = from_image(image) {
        return Ok(vec![f]);
    }
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len() as f64 / MB);
    let mut f = Figure::new(
        "7. Size: the etcd-steward binary (no image to measure)",
        "MB",
        Target::AtMost(10.0),
    )
    .with_baseline("the etcd binary");
    f.agent = vec![size(steward_bin)?];
    f.baseline = vec![size(etcd_bin)?];
    f.note = format!(
        "`docker image inspect {image}` found nothing, so binaries: {} vs {}",
        steward_bin.display(),
        etcd_bin.display()
    );
    Ok(vec![f])
}

fn from_image(image: &str) -> Option<Figure> {
    let total: f64 = docker(&["image", "inspect", image, "--format", "{{.Size}}"])?
        .trim()
        .parse()
        .ok()?;
    let history = docker(&[
        "history",
        "--no-trunc",
        "--human=false",
        "--format",
        "{{.Size}}\t{{.CreatedBy}}",
        image,
    ])?;
    let (mut steward, mut etcd) = (0.0, 0.0);
    for line in history.lines() {
        let Some((size, by)) = line.split_once('\t') else {
            continue;
        };
        let size: f64 = size.trim().parse().unwrap_or(0.0);
        if by.contains("bin/etcd-steward") {
            steward += size;
        } else if by.contains("bin/etcdctl") || by.contains("bin/etcd ") {
            etcd += size;
        }
    }
    if steward == 0.0 || etcd == 0.0 {
        return None;
    }
    let mut f = Figure::new(
        format!("7. Image `{image}`: the layer etcd-steward adds"),
        "MB",
        Target::AtMost(10.0),
    )
    .with_baseline("etcd's layer (etcd, etcdctl, etcdutl)");
    f.agent = vec![steward / MB];
    f.baseline = vec![etcd / MB];
    f.note = format!(
        "image total {:.1} MB (docker's size, 10⁶ bytes); layers from `docker history`",
        total / MB
    );
    Some(f)
}
