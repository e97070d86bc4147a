#pragma once
// Settings both backends read from the environment.
namespace expar {

// The wait timeout in seconds: EXPAR_COMM_TIMEOUT when set (finite, positive, at most 1e6), else `fallback`.
// Throws expar::Error naming the variable when it is set to anything else (inf, nan, 0, text).
double comm_timeout_seconds(double fallback);

}  // namespace expar
