#include "models/palette.h"

#include <array>
#include <cstdint>

namespace gradscope::gui {

namespace {
constexpr std::array<QRgb, kPaletteSize> kTableau10 = {0x4e79a7, 0xf28e2b, 0xe15759, 0x76b7b2, 0x59a14f,
                                                       0xedc948, 0xb07aa1, 0xff9da7, 0x9c755f, 0xbab0ac};
}  // namespace

QColor paletteColor(int index) {
  const int i = ((index % kPaletteSize) + kPaletteSize) % kPaletteSize;
  return QColor::fromRgb(kTableau10[static_cast<std::size_t>(i)]);
}

QColor apiColor(Api api) {
  switch (api) {
    case Api::MpiAllreduce:
    case Api::NcclAllReduce: return paletteColor(0);
    case Api::MpiIallreduce: return paletteColor(3);
    case Api::MpiReduceScatter:
    case Api::MpiReduceScatterBlock:
    case Api::NcclReduceScatter: return paletteColor(1);
    case Api::MpiAllgather:
    case Api::NcclAllGather: return paletteColor(4);
    case Api::MpiBcast:
    case Api::NcclBroadcast: return paletteColor(6);
    case Api::MpiReduce:
    case Api::NcclReduce: return paletteColor(2);
    case Api::NcclGroup: return paletteColor(8);
    case Api::Unknown: break;
  }
  return paletteColor(9);
}

QColor strategyColor(std::string_view strategy) {
  std::uint32_t hash = 2166136261u;
  for (const char c : strategy) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 16777619u;
  }
  return paletteColor(static_cast<int>(hash % kPaletteSize));
}

QColor dimmedColor() {
  return QColor(0xd8, 0xd8, 0xd8);
}

}  // namespace gradscope::gui
