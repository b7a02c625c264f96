// One table of names per enum: every name parses back to its value, and a wrong name is refused
// with the choices in table order and the nearest one.
#include <gtest/gtest.h>

#include "core/enum_names.hpp"
#include "core/error.hpp"

namespace ptdp {
namespace {

enum class Colour { Red, Green, Blue };
constexpr EnumName kColours[] = {{static_cast<int>(Colour::Red), "red"}, {static_cast<int>(Colour::Green), "green"}, {static_cast<int>(Colour::Blue), "blue"}};

TEST(EnumNames, EveryNameParsesBackToItsValue) {
  for (const EnumName& n : kColours) {
    EXPECT_EQ(enum_name(kColours, n.value), n.name);
    EXPECT_EQ(parse_enum(kColours, n.name, "colour"), n.value);
  }
  EXPECT_EQ(parse_enum_as<Colour>(kColours, "blue", "colour"), Colour::Blue);
  EXPECT_EQ(enum_name(kColours, 7), "?");
  EXPECT_EQ(enum_choices(kColours), "red, green or blue");
}

TEST(EnumNames, AWrongNameIsRefusedWithTheChoicesAndTheNearest) {
  try {
    parse_enum(kColours, "gren", "colour", "paint.colour");
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("paint.colour"), std::string::npos) << what;
    EXPECT_NE(what.find("unknown colour 'gren', expected red, green or blue (did you mean 'green'?)"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace ptdp
