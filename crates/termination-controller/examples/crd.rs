//! Writes the CRDs (NodeDisruptionBudget, NodeDrainRule) into the directory given;
//! `cargo xtask crd` points it at the chart's `crds/`.

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let directory = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .ok_or_else(|| std::io::Error::other("usage: crd <directory>"))?;
    for (file, yaml) in termination_controller::api::crds_yaml() {
        let path = directory.join(file);
        std::fs::write(&path, yaml)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
