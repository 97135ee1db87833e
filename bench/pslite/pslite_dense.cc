// ps-lite's side of `ps-bench --pslite`: the same dense workload as ps-bench's dense cases, on
// ps-lite's KV API (ZeroMQ van), so both can be measured side by side in one run.
//
// Each worker owns one dense tensor of FLOATS floats, split into one key per server (the last
// server takes the remainder). A server keeps one f32 vector per key and applies plain SGD
// (w -= 0.001 * g) to it on each push, as ps-bench's tables do; a pull returns the vector
// (zero-copy: ps-lite sends straight from it, which is safe here because a worker's push and
// pull of one key never overlap). A step is a push then a pull of the whole tensor, each
// waited for (`pair`), or both issued before waiting (`fused`).
//
// Roles and addresses come from ps-lite's usual environment (DMLC_ROLE, DMLC_NUM_SERVER,
// DMLC_NUM_WORKER, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT). A worker prints one line when done:
//   {"worker":RANK,"elapsed_s":E,"pairs_ms":[...]}
// Usage: pslite-dense FLOATS SECONDS WARMUP_SECONDS pair|fused
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "ps/ps.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Store {
  std::unordered_map<ps::Key, ps::SArray<float>> rows;
};

Store* store = nullptr;

void Handle(const ps::KVMeta& meta, const ps::KVPairs<float>& req, ps::KVServer<float>* server) {
  ps::KVPairs<float> res;
  size_t offset = 0;
  for (size_t i = 0; i < req.keys.size(); ++i) {
    ps::Key key = req.keys[i];
    if (meta.push) {
      size_t len = req.lens.empty() ? req.vals.size() : static_cast<size_t>(req.lens[i]);
      auto& w = store->rows[key];
      if (w.empty()) {
        w.resize(len, 0.0f);
      }
      CHECK_EQ(w.size(), len) << "key " << key << " pushed with another length";
      const float* g = req.vals.data() + offset;
      float* p = w.data();
      for (size_t j = 0; j < len; ++j) p[j] -= 0.001f * g[j];
      offset += len;
    } else {
      auto it = store->rows.find(key);
      CHECK(it != store->rows.end()) << "pull of key " << key << " before its first push";
      res.keys.push_back(key);
      res.lens.push_back(static_cast<int>(it->second.size()));
      if (req.keys.size() == 1) {
        res.vals = it->second;  // shares the vector's memory: no copy
      } else {
        res.vals.append(it->second);
      }
    }
  }
  server->Response(meta, res);
}

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

void RunWorker(size_t floats, double seconds, double warmup, bool fused) {
  ps::KVWorker<float> kv(0, 0);
  const auto ranges = ps::Postoffice::Get()->GetServerKeyRanges();
  const size_t servers = ranges.size();
  const int rank = ps::MyRank();
  ps::SArray<ps::Key> keys;
  ps::SArray<int> lens;
  for (size_t s = 0; s < servers; ++s) {
    keys.push_back(ranges[s].begin() + static_cast<ps::Key>(rank));
    size_t len = floats / servers + (s + 1 == servers ? floats % servers : 0);
    lens.push_back(static_cast<int>(len));
  }
  // Random values, as real gradients are (ps-bench does the same).
  std::mt19937 rng(static_cast<unsigned>(rank));
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  ps::SArray<float> grad(floats);
  for (size_t i = 0; i < floats; ++i) grad[i] = normal(rng);
  ps::SArray<float> w(floats, 0.0f);
  ps::SArray<int> pulled_lens(servers, 0);

  auto step = [&]() {
    if (fused) {
      int a = kv.ZPush(keys, grad, lens);
      int b = kv.ZPull(keys, &w, &pulled_lens);
      kv.Wait(a);
      kv.Wait(b);
    } else {
      kv.Wait(kv.ZPush(keys, grad, lens));
      kv.Wait(kv.ZPull(keys, &w, &pulled_lens));
    }
  };
  auto t0 = Clock::now();
  do {
    step();
  } while (Ms(Clock::now() - t0) < warmup * 1e3);
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup);

  std::vector<double> pairs;
  auto start = Clock::now();
  while (pairs.size() < 3 || Ms(Clock::now() - start) < seconds * 1e3) {
    auto t = Clock::now();
    step();
    pairs.push_back(Ms(Clock::now() - t));
  }
  double elapsed = Ms(Clock::now() - start) / 1e3;
  std::string line = "{\"worker\":" + std::to_string(rank) +
                     ",\"elapsed_s\":" + std::to_string(elapsed) + ",\"pairs_ms\":[";
  for (size_t i = 0; i < pairs.size(); ++i) {
    if (i) line += ",";
    char buf[32];
    snprintf(buf, sizeof buf, "%.4f", pairs[i]);
    line += buf;
  }
  line += "]}\n";
  fputs(line.c_str(), stdout);
  fflush(stdout);
}

}  // namespace

int main(int argc, char* argv[]) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s FLOATS SECONDS WARMUP_SECONDS pair|fused\n", argv[0]);
    return 2;
  }
  size_t floats = strtoull(argv[1], nullptr, 10);
  double seconds = atof(argv[2]);
  double warmup = atof(argv[3]);
  std::string how = argv[4];
  if (floats == 0 || (how != "pair" && how != "fused")) {
    fprintf(stderr, "bad arguments\n");
    return 2;
  }
  ps::Start(0);
  if (ps::IsServer()) {
    store = new Store();
    auto server = new ps::KVServer<float>(0);
    server->set_request_handle(Handle);
    ps::RegisterExitCallback([server]() { delete server; });
  }
  if (ps::IsWorker()) RunWorker(floats, seconds, warmup, how == "fused");
  ps::Finalize(0, true);
  return 0;
}
