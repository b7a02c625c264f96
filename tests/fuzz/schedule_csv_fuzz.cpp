// Fuzz target: the schedule CSV parser and the validation of imported programs (from_csv:
// parsing, stage placement, lowering or validate_lowered, the deadlock check). Any input must
// either give a schedule or be refused with a ConfigError; anything else is a finding.
// A schedule that is accepted must survive a CSV round trip.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "schedules/schedule.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ptdp::Schedule s = ptdp::from_csv(text, "fuzz.csv");
    PTDP_ASSERT(s.lowered, "an imported schedule is lowered");
    const ptdp::Schedule again = ptdp::from_csv(ptdp::to_csv(s), "round-trip.csv");
    PTDP_ASSERT(again.num_actions() == s.num_actions(), "the CSV round trip keeps every action");
  } catch (const ptdp::ConfigError&) {
  }
  return 0;
}
