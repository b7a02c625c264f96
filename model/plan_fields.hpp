// Every field of a ParallelPlan, listed once: what copies a whole plan field by field (the
// sweep's outcomes sent between ranks under mpirun) reads this table, so a new field is one line
// here and no copy drops it. The test tests/model/plan_fields_test.cpp fails when a field of
// ParallelPlan is missing from the table.
#pragma once

#include <cstdint>
#include <vector>

#include "model/plan.hpp"

namespace ptdp {

/// A scalar field (integer, bool or enum), read and written as an integer.
struct PlanScalarField {
  const char* name;  // the member's name
  int64_t (*get)(const ParallelPlan&);
  void (*set)(ParallelPlan&, int64_t);
};

/// A list field (layers per stage).
struct PlanListField {
  const char* name;
  std::vector<int64_t> ParallelPlan::*member;
};

const std::vector<PlanScalarField>& plan_scalar_fields();
const std::vector<PlanListField>& plan_list_fields();

/// The plan as integers (scalars in table order, then each list's length and values), and back:
/// plan_from_integers(plan_integers(p)) == p field for field. Throws std::invalid_argument on a
/// sequence of another length.
std::vector<int64_t> plan_integers(const ParallelPlan& p);
ParallelPlan plan_from_integers(const std::vector<int64_t>& v);

}  // namespace ptdp
