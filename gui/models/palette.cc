#include "models/palette.h"

#include <array>
#include <cstdint>

namespace gradscope::gui {

namespace {
constexpr std::array<QRgb, kPaletteSize> kTableau10 = {0x4e79a7, 0xf28e2b, 0xe15759, 0x76b7b2, 0x59a14f,
                                                       0xedc948, 0xb07aa1, 0xff9da7, 0x9c755f, 0xbab0ac};

// What a nonblocking call's colour keeps of its blocking form's: light enough to tell apart in the
// legend, dark enough to stay visible on the timeline's white and striped rows.
constexpr double kNonblockingTint = 0.35;

QRgb operationColour(Collective collective) {
  switch (collective) {
    case Collective::AllReduce: return kTableau10[0];
    case Collective::ReduceScatter: return kTableau10[1];
    case Collective::Reduce: return kTableau10[2];
    case Collective::AllGather: return kTableau10[4];
    case Collective::Broadcast: return kTableau10[6];
    case Collective::Group: return kTableau10[8];
    case Collective::Gather: return kTableau10[3];
    case Collective::Scatter: return 0x2e7d78;
    case Collective::AllToAll: return 0xe377c2;
    case Collective::Barrier: return 0x4b5563;
    case Collective::Send: return 0xa67c00;
    case Collective::SendRecv: return 0xd4a017;
    case Collective::Recv: return kTableau10[5];
    case Collective::Unknown: break;
  }
  return kTableau10[9];
}
}  // namespace

QColor paletteColor(int index) {
  const int i = ((index % kPaletteSize) + kPaletteSize) % kPaletteSize;
  return QColor::fromRgb(kTableau10[static_cast<std::size_t>(i)]);
}

QColor apiColor(Api api) {
  const QColor colour = QColor::fromRgb(operationColour(collectiveOf(api)));
  if (!isNonblocking(api)) return colour;
  const auto tint = [](int channel) {
    return channel + static_cast<int>((255 - channel) * kNonblockingTint + 0.5);
  };
  return QColor(tint(colour.red()), tint(colour.green()), tint(colour.blue()));
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
