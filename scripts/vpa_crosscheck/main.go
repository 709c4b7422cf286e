package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"k8s.io/autoscaler/vertical-pod-autoscaler/pkg/recommender/logic"
	"k8s.io/autoscaler/vertical-pod-autoscaler/pkg/recommender/model"
)

// Reads tab-separated "group pod unix_seconds cpu_cores memory_bytes" lines (or "group pod unix_seconds - request_bytes
// oom" for an OOM kill) in the order to feed them; prints per group, as JSON, the target, lower and upper bound of CPU
// (millicores) and memory (bytes) from VPA's own pod recommender (one container per group).
func main() {
	states := map[string]*model.AggregateContainerState{}
	containers := map[string]*model.ContainerState{}
	scanner := bufio.NewScanner(os.Stdin)
	for scanner.Scan() {
		f := strings.Split(scanner.Text(), "\t")
		group, pod := f[0], f[1]
		sec, _ := strconv.ParseInt(f[2], 10, 64)
		t := time.Unix(sec, 0)
		if states[group] == nil {
			states[group] = model.NewAggregateContainerState()
		}
		key := group + "\x00" + pod
		if containers[key] == nil {
			containers[key] = model.NewContainerState(model.Resources{}, states[group])
		}
		if len(f) > 5 && f[5] == "oom" {
			request, _ := strconv.ParseFloat(f[4], 64)
			_ = containers[key].RecordOOM(t, model.ResourceAmount(request))
			continue
		}
		if f[3] != "" {
			cores, _ := strconv.ParseFloat(f[3], 64)
			containers[key].AddSample(&model.ContainerUsageSample{MeasureStart: t, Usage: model.CPUAmountFromCores(cores), Resource: model.ResourceCPU})
		}
		if f[4] != "" {
			bytes, _ := strconv.ParseFloat(f[4], 64)
			containers[key].AddSample(&model.ContainerUsageSample{MeasureStart: t, Usage: model.MemoryAmountFromBytes(bytes), Resource: model.ResourceMemory})
		}
	}
	recommender := logic.CreatePodResourceRecommender()
	out := map[string][]int64{}
	for group, state := range states {
		got := recommender.GetRecommendedPodResources(model.ContainerNameToAggregateStateMap{group: state})[group]
		out[group] = []int64{int64(got.Target[model.ResourceCPU]), int64(got.LowerBound[model.ResourceCPU]), int64(got.UpperBound[model.ResourceCPU]),
			int64(got.Target[model.ResourceMemory]), int64(got.LowerBound[model.ResourceMemory]), int64(got.UpperBound[model.ResourceMemory])}
	}
	encoded, _ := json.Marshal(out)
	fmt.Println(string(encoded))
}
