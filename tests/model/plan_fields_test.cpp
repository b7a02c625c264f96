// The plan's field table: complete (every member of ParallelPlan in model/plan.hpp is listed) and
// a whole plan survives the trip through integers, which the sweep sends between MPI ranks.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "model/plan_fields.hpp"

namespace ptdp {
namespace {

// The data members declared in `struct ParallelPlan { … };` of model/plan.hpp (a line
// `  TYPE name = …;` or `  TYPE name;` at the struct's indentation).
std::set<std::string> declared_members() {
  std::ifstream in(std::string(PTDP_SOURCE_DIR) + "/model/plan.hpp");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const size_t from = text.find("struct ParallelPlan {");
  const size_t to = text.find("\n};", from);
  EXPECT_NE(from, std::string::npos);
  const std::string body = text.substr(from, to - from);
  const std::regex member(R"(\n  (?:const )?([A-Za-z_][A-Za-z0-9_:<>]*) ([a-z_][a-z0-9_]*)(?: = [^;(]*|\{[^;(]*\})?;)");
  std::set<std::string> names;
  for (auto it = std::sregex_iterator(body.begin(), body.end(), member); it != std::sregex_iterator(); ++it)
    if ((*it)[1] != "return") names.insert((*it)[2]);
  return names;
}

TEST(PlanFields, EveryMemberOfParallelPlanIsInTheTable) {
  std::set<std::string> listed;
  for (const auto& f : plan_scalar_fields()) EXPECT_TRUE(listed.insert(f.name).second) << "listed twice: " << f.name;
  for (const auto& f : plan_list_fields()) EXPECT_TRUE(listed.insert(f.name).second) << "listed twice: " << f.name;
  const auto declared = declared_members();
  EXPECT_GT(declared.size(), 40u);  // the parse found the struct's members
  for (const auto& name : declared) EXPECT_TRUE(listed.count(name)) << "ParallelPlan::" << name << " is not in plan_fields.cpp's table";
  for (const auto& name : listed) EXPECT_TRUE(declared.count(name)) << name << " is in the table but not a member of ParallelPlan";
}

TEST(PlanFields, AWholePlanSurvivesTheTripThroughIntegers) {
  // Every scalar moved off its default (1 → 0, anything else → itself + 1: bools flip, enums take
  // another value), both lists filled.
  ParallelPlan p;
  for (const auto& f : plan_scalar_fields()) {
    const int64_t was = f.get(p);
    f.set(p, was == 1 ? 0 : was + 1);
  }
  p.layers_per_stage = {3, 5, 7};
  p.balanced_layers = {4, 4};
  const ParallelPlan back = plan_from_integers(plan_integers(p));
  for (const auto& f : plan_scalar_fields()) EXPECT_EQ(f.get(back), f.get(p)) << f.name;
  EXPECT_EQ(back.layers_per_stage, p.layers_per_stage);
  EXPECT_EQ(back.balanced_layers, p.balanced_layers);
  // A default plan differs from it in every field: the trip did not just keep defaults.
  for (const auto& f : plan_scalar_fields()) EXPECT_NE(f.get(back), f.get(ParallelPlan{})) << f.name;
}

TEST(PlanFields, ASequenceOfAnotherLengthIsRefused) {
  auto v = plan_integers(ParallelPlan{});
  v.pop_back();
  EXPECT_THROW(plan_from_integers(v), std::invalid_argument);
  v = plan_integers(ParallelPlan{});
  v.push_back(1);
  EXPECT_THROW(plan_from_integers(v), std::invalid_argument);
  v = plan_integers(ParallelPlan{});
  v[plan_scalar_fields().size()] = 1000;  // a list longer than what follows
  EXPECT_THROW(plan_from_integers(v), std::invalid_argument);
}

}  // namespace
}  // namespace ptdp
