// Internal to the config system: conversion of toml11 values into config Values, and short
// descriptions of TOML values for error messages. Includes <toml.hpp>, so only the config
// system's .cpp files include it.
#pragma once

#include <string>
#include <toml.hpp>

#include "train/config/value.h"

namespace mt::train::config {

// `value` as a key of `type`, or the problem: "expected an integer, got string \"ten\"".
Parsed from_toml(FieldType type, const toml::value& value);

// What a TOML value is, for "got ..." in messages: string "ten", integer 10, float 0.5,
// boolean true, array, table, date-time.
std::string describe(const toml::value& value);

}  // namespace mt::train::config
