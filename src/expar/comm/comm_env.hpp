#pragma once
// Settings both backends read from the environment.
namespace expar {

// The wait timeout in seconds: EXPAR_COMM_TIMEOUT when set (a positive number), else `fallback`.
// Throws expar::Error naming the variable when it is set to something that is not a positive number.
double comm_timeout_seconds(double fallback);

}  // namespace expar
