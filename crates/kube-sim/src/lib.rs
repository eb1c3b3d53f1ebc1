//! kube-sim.
