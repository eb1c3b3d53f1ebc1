//! The integration tests of core against kube-sim.

mod k8s_sim;
