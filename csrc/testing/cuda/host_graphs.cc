// The host implementation's graph capture and launch (see host_gpu.h): streams capture their
// work, and every stream that waits on an event recorded in the capture joins it; a launch runs
// the graph's lanes on streams of their own, joined back into the launching stream.
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "testing/cuda/host_gpu.h"
#include "testing/cuda/host_internal.h"
#include "testing/cuda/host_streams.h"

namespace ringcomm::hostgpu {
namespace {

// The runtime's capture and graph calls over the test entry points below: an instantiated graph
// is the captured one (host graphs stay for the process, as endCapture's do).
cudaError_t streamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  count("cudaStreamBeginCapture");
  if (capturing(s)) return failed(cudaErrorIllegalState);
  beginCapture(s);
  return cudaSuccess;
}

cudaError_t streamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  count("cudaStreamEndCapture");
  const uintptr_t handle = endCapture(s);
  if (handle == 0) return failed(cudaErrorStreamCaptureInvalidated);
  *graph = reinterpret_cast<cudaGraph_t>(handle);
  return cudaSuccess;
}

cudaError_t graphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  count("cudaGraphInstantiate");
  *exec = reinterpret_cast<cudaGraphExec_t>(graph);
  return cudaSuccess;
}

cudaError_t graphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  count("cudaGraphLaunch");
  launchGraph(reinterpret_cast<uintptr_t>(exec), s);
  return cudaSuccess;
}

cudaError_t graphExecDestroy(cudaGraphExec_t) {
  count("cudaGraphExecDestroy");
  return cudaSuccess;
}

cudaError_t graphDestroy(cudaGraph_t) {
  count("cudaGraphDestroy");
  return cudaSuccess;
}

// The graph a capture builds is the capture's own until endCapture moves it out.
cudaError_t streamGetCaptureInfo(cudaStream_t s, cudaStreamCaptureStatus* status,
                                 unsigned long long* id, cudaGraph_t* graph,
                                 const cudaGraphNode_t**, const cudaGraphEdgeData**, size_t*) {
  count("cudaStreamGetCaptureInfo");
  Capture* capture = stream(s)->capture;
  *status = capture ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  if (id) *id = reinterpret_cast<uintptr_t>(capture);
  if (graph) *graph = capture ? reinterpret_cast<cudaGraph_t>(&capture->graph) : nullptr;
  return cudaSuccess;
}

cudaError_t userObjectCreate(cudaUserObject_t* object, void* data, cudaHostFn_t destroy,
                             unsigned int references, unsigned int) {
  count("cudaUserObjectCreate");
  *object = reinterpret_cast<cudaUserObject_t>(
      new UserObject{data, destroy, static_cast<int>(references)});
  return cudaSuccess;
}

cudaError_t graphRetainUserObject(cudaGraph_t graph, cudaUserObject_t handle, unsigned int count,
                                  unsigned int flags) {
  ringcomm::hostgpu::count("cudaGraphRetainUserObject");
  if (graph == nullptr || count != 1) return failed(cudaErrorInvalidValue);
  auto* object = reinterpret_cast<UserObject*>(handle);
  if (!(flags & cudaGraphUserObjectMove)) ++object->references;  // else the caller's moves
  reinterpret_cast<Graph*>(graph)->userObjects.push_back(object);
  return cudaSuccess;
}

}  // namespace

void fillGraphs(GpuApi& a) {
  a.cudaStreamBeginCapture = streamBeginCapture;
  a.cudaStreamEndCapture = streamEndCapture;
  a.cudaGraphInstantiate = graphInstantiate;
  a.cudaGraphLaunch = graphLaunch;
  a.cudaGraphExecDestroy = graphExecDestroy;
  a.cudaGraphDestroy = graphDestroy;
  a.cudaStreamGetCaptureInfo = streamGetCaptureInfo;
  a.cudaUserObjectCreate = userObjectCreate;
  a.cudaGraphRetainUserObject = graphRetainUserObject;
}

void destroyGraph(uintptr_t handle) {
  auto* graph = reinterpret_cast<Graph*>(handle);
  for (UserObject* object : graph->userObjects)
    if (--object->references == 0) {
      object->destroy(object->data);
      delete object;
    }
  graph->userObjects.clear();
}

void beginCapture(cudaStream_t s) {
  Stream* st = stream(s);
  st->capture = new Capture();
  st->lane = 0;
  st->capture->graph.lanes.emplace_back();
  st->capture->members.push_back(st);
}

uintptr_t endCapture(cudaStream_t s) {
  Stream* st = stream(s);
  Capture* capture = st->capture;
  if (capture == nullptr || st->lane != 0) return 0;
  for (Stream* member : capture->members) member->capture = nullptr;
  for (Event* ev : capture->events) {
    std::lock_guard<std::mutex> lock(ev->mutex);
    if (ev->capturedIn == capture) ev->capturedIn = kEndedCapture;
  }
  auto* graph = new Graph(std::move(capture->graph));  // kept for the process (tests)
  delete capture;
  return reinterpret_cast<uintptr_t>(graph);
}

void launchGraph(uintptr_t handle, cudaStream_t s) {
  const Graph& graph = *reinterpret_cast<const Graph*>(handle);
  Stream* origin = stream(s);
  // This launch's events: one per record inside the graph, and a start the other lanes wait on.
  auto events = std::make_shared<std::vector<Event>>(graph.records + 1);
  Event* start = &events->back();
  start->recorded = 1;
  origin->push([start] { complete(start, 1); });
  // External waits take the latest record before this launch; its own external records follow.
  std::vector<std::vector<uint64_t>> targets(graph.lanes.size());
  for (size_t lane = 0; lane < graph.lanes.size(); ++lane)
    for (const Node& node : graph.lanes[lane]) {
      if (node.kind != Node::WaitExternal) continue;
      std::lock_guard<std::mutex> lock(node.event->mutex);
      targets[lane].push_back(node.event->recorded);
    }
  std::vector<Stream*> lanes{origin};
  for (size_t lane = 1; lane < graph.lanes.size(); ++lane) lanes.push_back(new Stream());
  for (size_t lane = 0; lane < graph.lanes.size(); ++lane) {
    Stream* st = lanes[lane];
    if (lane > 0) waitFor(st, start, 1);
    size_t external = 0;
    for (const Node& node : graph.lanes[lane]) {
      Event* ev = nullptr;
      switch (node.kind) {
        case Node::Work:
          st->push(node.work);
          break;
        case Node::Record:
          ev = &(*events)[node.record];
          st->push([events, ev] { complete(ev, 1); });
          break;
        case Node::Wait:
          waitFor(st, &(*events)[node.record], 1);
          break;
        case Node::RecordExternal: {
          uint64_t generation;
          {
            std::lock_guard<std::mutex> lock(node.event->mutex);
            generation = ++node.event->recorded;
          }
          completeHandle(st, node.event, generation);
          break;
        }
        case Node::WaitExternal:
          if (const uint64_t target = targets[lane][external++])
            waitForHandle(st, node.event, target);
          break;
      }
    }
  }
  // The capture joined every lane back into the origin, which frees the others once done.
  std::vector<Stream*> others(lanes.begin() + 1, lanes.end());
  origin->push([others, events] {
    for (Stream* st : others) delete st;
  });
}

}  // namespace ringcomm::hostgpu
