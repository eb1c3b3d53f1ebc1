//! out-of-service-gc
