// Reading VM requirement lists for `flytctl vm-import` (no database here).
//
// Owns: parsing a MongoDB export of Flyt's vm_required_resources collection
// (a JSON array of documents, or one document per line as mongoexport writes;
// numbers plain or Extended JSON such as {"$numberInt":"8"}) or a CSV file with
// a header row (columns vm_ip, host_ip, compute_units, memory in any order,
// RFC 4180 quoting), and validating each row. Must not touch any database or
// the network: flytctl links this without the store.
//
// Fields: vm_ip, host_ip (non-empty text), compute_units (integer >= 0, SMs),
// memory (number >= 0, GB; `memory_gb` is accepted as another name), and the
// optional gpus (integer >= 1, default 1: GPUs, each with that share). Other
// fields/columns (e.g. `_id`) are ignored. A vm_ip listed twice is an error.
// Errors read "FILE:LINE: field NAME: what is wrong".
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "store/store.h"  // VmRequirement only; nothing here links the store

namespace flyt::store {

// Reads `path`; the format is chosen by content: first non-space character
// `[` or `{` = JSON, anything else = CSV.
Status ParseVmFile(const std::string& path, std::vector<VmRequirement>* out);

// Same for text already in memory; `source` names it in error messages.
Status ParseVmText(const std::string& text, const std::string& source,
                   std::vector<VmRequirement>* out);

}  // namespace flyt::store
