// Early-return helpers for absl::Status / absl::StatusOr, used across iris.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define IRIS_STATUS_CONCAT_INNER(a, b) a##b
#define IRIS_STATUS_CONCAT(a, b) IRIS_STATUS_CONCAT_INNER(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define IRIS_RETURN_IF_ERROR(expr)                 \
  do {                                             \
    ::absl::Status iris_status_ = (expr);          \
    if (!iris_status_.ok()) return iris_status_;   \
  } while (0)

// `IRIS_ASSIGN_OR_RETURN(auto x, MakeX());` declares/assigns x or returns the error.
#define IRIS_ASSIGN_OR_RETURN(lhs, expr) \
  IRIS_ASSIGN_OR_RETURN_IMPL(IRIS_STATUS_CONCAT(iris_statusor_, __LINE__), lhs, expr)
#define IRIS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return std::move(tmp).status();   \
  lhs = std::move(tmp).value()
